"""First contact with an accelerator: one command that checks and measures what matters before a real run
(zaya_jax/bench/gpu_check; how to run it and where reports go: benchmarks/gpu/README.md).

    python -m launch.gpu_check --out=benchmarks/gpu/h100            # ≤ 8 min on one H100 / H200 / MI300X
    python -m launch.gpu_check --smoke --out=/tmp/gpu_check         # every section at CPU sizes (CI)
    python -m launch.gpu_check --lower=rocm,cuda --config=experiments/zaya1_tiny.py   # from any host, no GPU

`--out` writes DIR/report.md and DIR/report.csv (one row per measurement) and exits 1 if any check failed:
device / versions / environment / resolved kernels, bf16 GEMM peak and HBM bandwidth, loss parity against the
CPU in fp32, train-step time / tokens/s / MFU per grouped-GEMM and attention kernel, compiled memory and compile
time against `launch.plan`. `--lower` lowers the train step of `--config` for each platform from this host and
prints `lowered for <platform>: ok (<N> ops; CPU-only ops: <K>)` per platform; exit 1 if one is not ok.
"""

from launch.cpu_devices import prepare_host

prepare_host()

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402
from zaya_jax.bench.gpu_check.cases import FILL_CONFIGS  # noqa: E402

PLATFORMS = ("rocm", "cuda", "cpu")

_CONFIG = config_flags.DEFINE_config_file("config", None, "--lower: experiment config file (default: the tiny one)")
flags.DEFINE_string("out", None, "write report.md and report.csv into this directory")
flags.DEFINE_bool("smoke", False, "every section at tiny shapes on the CPU kernels, 1-2 timing trials (CI)")
flags.DEFINE_list("lower", None, f"lower the train step for these platforms ({', '.join(PLATFORMS)}) and exit")
flags.DEFINE_list("configs", list(FILL_CONFIGS), f"--out: configs that fill one GPU, of {', '.join(FILL_CONFIGS)}")
flags.DEFINE_float("budget_s", 320.0, "--out: cases other than the defaults that would start later are skipped")
flags.DEFINE_string("job", None, "internal: run one gpu_check job in this process (zaya_jax.bench.gpu_check.jobs)")
flags.DEFINE_string("job_spec", "{}", "internal: the job's JSON spec")
flags.DEFINE_string("job_out", None, "internal: where the job writes its JSON result")
cpu_devices.define_flag(None, "emulated CPU devices (default 8 for --lower, else 1; 0 = as the environment says)")
FLAGS = flags.FLAGS
PROG = "gpu_check"


def lower(platforms: list[str]) -> None:
    """Print one `lowered for ...` line per platform; exit 1 if any lowering is not ok."""
    from zaya_jax.bench.lowering import lower_step  # imported here: the --out path does not need it
    from zaya_jax.config import load_config

    config = _CONFIG.value if _CONFIG.value is not None else load_config("experiments/zaya1_tiny.py")
    reports = [lower_step(config, platform) for platform in platforms]
    for r in reports:
        print(r.line(), flush=True)
    if not all(r.ok for r in reports):
        for r in reports:
            for problem in r.problems:
                print(f"{PROG}: {r.platform}: {problem}", file=sys.stderr)
        sys.exit(cli.EXIT_FAILURE)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.job:
        cpu_devices.emulate(1, explicit=False)
        cli.compilation_cache("none")
        from zaya_jax.bench.gpu_check import jobs

        jobs.run_job(FLAGS.job, json.loads(FLAGS.job_spec), FLAGS.job_out)
        return
    if FLAGS.lower:
        unknown = [p for p in FLAGS.lower if p not in PLATFORMS]
        if unknown:
            cli.fail(PROG, f"--lower={','.join(FLAGS.lower)}: unknown platform(s) {unknown}; choose from {PLATFORMS}")
        cpu_devices.emulate(8, explicit=False)
        lower(FLAGS.lower)
        return
    if not FLAGS.out:
        cli.fail(PROG, "give --out=DIR (the check and its report) or --lower=rocm,cuda (lowering only)")
    unknown = sorted(set(FLAGS.configs) - set(FILL_CONFIGS))
    if unknown or not FLAGS.configs:
        cli.fail(PROG, f"--configs={','.join(FLAGS.configs)}: choose one or more of {', '.join(FILL_CONFIGS)}")
    cpu_devices.emulate(1, explicit=False)
    cli.compilation_cache("none")  # compile times are measured: no persistent-cache hits
    # This process only runs the small sections on the device; the train-step cases run in processes of their own
    # (zaya_jax/bench/gpu_check/__init__.py) and get the device memory as the user configured it.
    child_env = (("XLA_PYTHON_CLIENT_PREALLOCATE", os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")),)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # before the backend starts

    from zaya_jax.bench.gpu_check import Options, run

    options = Options(
        out_dir=FLAGS.out,
        smoke=FLAGS.smoke,
        configs=tuple(FLAGS.configs),
        budget_s=FLAGS.budget_s,
        job_command=(sys.executable, "-m", "launch.gpu_check"),
        command="python -m launch.gpu_check " + shlex.join(sys.argv[1:]),
        child_env=child_env,
    )
    if run(options):
        sys.exit(cli.EXIT_FAILURE)


if __name__ == "__main__":
    cli.run(main, PROG)
