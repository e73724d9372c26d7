"""Show the host setup a launcher gets: huge-page tunable, XLA_FLAGS, emulated CPU devices (`launch.cpu_devices`).

    python -m launch.host_setup [--cpu_devices=N]

An explicit `--cpu_devices` wins over an inherited `XLA_FLAGS` device count; without it (default 8) an inherited
count is kept.
"""

from launch.cpu_devices import prepare_host

prepare_host()

import os  # noqa: E402

import jax  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402

cpu_devices.define_flag(8)


def main(argv: list[str]) -> None:
    del argv
    print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')}")
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
    print(f"jax_num_cpu_devices={jax.config.jax_num_cpu_devices}")
    print(f"devices={jax.device_count()} ({jax.default_backend()})")


if __name__ == "__main__":
    cli.run(main, "host_setup")
