"""Emulated CPU devices for the launchers.

XLA reads `--xla_force_host_platform_device_count` once, when jax is first imported — before absl
parses flags. Launchers therefore call `emulate_from_argv()` at import time: it peeks at
`--cpu_devices=N` in `sys.argv` (default given by the launcher; 0 = leave XLA_FLAGS alone) and appends
the XLA flag unless XLA_FLAGS already sets it. The flag only affects the CPU platform, so it is
harmless on GPU hosts.
"""

from __future__ import annotations

import os
import sys


def peek_cpu_devices(argv: list[str], default: int) -> int:
    """Value of --cpu_devices in argv (forms `--cpu_devices=N` and `--cpu_devices N`)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--cpu_devices="):
            return int(arg.split("=", 1)[1])
        if arg == "--cpu_devices" and i + 1 < len(argv):
            return int(argv[i + 1])
    return default


def emulate_from_argv(default: int = 8, argv: list[str] | None = None) -> None:
    if "jax" in sys.modules:  # too late to change the device count once jax is imported
        return
    n = peek_cpu_devices(sys.argv if argv is None else argv, default)
    flags_env = os.environ.get("XLA_FLAGS", "")
    if n > 0 and "xla_force_host_platform_device_count" not in flags_env:
        os.environ["XLA_FLAGS"] = f"{flags_env} --xla_force_host_platform_device_count={n}".strip()
