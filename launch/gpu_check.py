"""First contact with an accelerator: one command that checks and measures what matters before a real run
(zaya_jax/bench/gpu_check; how to run it and where reports go: benchmarks/gpu/README.md).

    python -m launch.gpu_check --out=benchmarks/gpu/h100            # ≤ 8 min on one H100 / H200 / MI300X
    python -m launch.gpu_check --smoke --out=/tmp/gpu_check         # every section at CPU sizes (CI)
    python -m launch.gpu_check --lower=rocm,cuda --config=experiments/zaya1_tiny.py   # from any host, no GPU
    python -m launch.gpu_check --compile=h100,mi300x --config=experiments/zaya1.py:1b --out=/tmp/gpu_compile

`--out` writes DIR/report.md and DIR/report.csv (one row per measurement) and exits 1 if any check failed:
device / versions / environment / resolved kernels, bf16 GEMM peak and HBM bandwidth, loss parity against the
CPU in fp32, train-step time / tokens/s / MFU per grouped-GEMM and attention kernel, compiled memory and compile
time against `launch.plan`. `--lower` lowers the train step of `--config` for each platform from this host and
prints `lowered for <platform>: ok (<N> ops; CPU-only ops: <K>)` per platform; exit 1 if one is not ok.
`--compile` compiles the train step of `--config` with the GPU compiler for each named target from any host
(the `gpu-compile` extra; `zaya_jax.planning.gpu_compile`), on `--mesh` over a topology of `--nodes` x
`--gpus_per_node` GPUs, one child process per target with the platform's XLA flags (those env.sh sets) and
`--xla_flags` (`launch.gpu_compile_job`); it prints `compiled for <target>: ok (peak ...)` per target, writes report.md,
report.json and <target>.hlo.txt (the scheduled HLO) into `--out`, and exits 1 if a target fails to compile or
does not fit.
The full check runs on a GPU only; on a host without one it stops at once (use --smoke, --lower or --compile).
`--out` is checked and created before any work.
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

PLATFORMS = ("rocm", "cuda", "cpu")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "--lower / --compile: experiment config file (default: the tiny one)"
)
flags.DEFINE_string("out", None, "write report.md and report.csv into this directory")
flags.DEFINE_bool("smoke", False, "every section at tiny shapes on the CPU kernels, 1-2 timing trials (CI)")
flags.DEFINE_list("lower", None, f"lower the train step for these platforms ({', '.join(PLATFORMS)}) and exit")
# (the case tables are imported in `main`: a bad --out is refused before the check's modules load)
flags.DEFINE_list("configs", None, "--out: configs that fill one GPU (default: all of gpu_check.cases.FILL_CONFIGS)")
flags.DEFINE_float("budget_s", 320.0, "--out: cases other than the defaults that would start later are skipped")
flags.DEFINE_list("compile", None, "compile the train step for these GPU targets (h100, h200, mi300x, mi325x)")
flags.DEFINE_string("mesh", None, "--compile: mesh sizes, e.g. data:8 or data:2,expert:4 (default: the config's)")
flags.DEFINE_integer("nodes", None, "--compile: nodes of the topology (default: what the mesh needs)", lower_bound=1)
flags.DEFINE_integer("gpus_per_node", 8, "--compile: GPUs per node", lower_bound=1)
flags.DEFINE_integer(
    "batch_per_device",
    None,
    "--compile: sequences per batch shard per micro-batch (default: the config's global batch)",
    lower_bound=1,
)
flags.DEFINE_integer("seq_len", None, "--compile: sequence length (default: the config's)", lower_bound=1)
flags.DEFINE_string(
    "xla_flags", "", "--compile: XLA flags added after the platform's, space-separated, e.g. '--xla_gpu_x=y --xla_z=1'"
)
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


def make_out_dir(path: str) -> str:
    """Create the checked `--out` folder once the inputs are known good, before the work that fills it."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        cli.fail(PROG, f"--out={path}: cannot create the report folder ({err.strerror or err})")
    return path


def _has_gpu() -> bool:
    import jax

    return any(d.platform in ("gpu", "cuda", "rocm") for d in jax.devices())


def _compile_setup():
    """(config set up for the compile, nodes, gpus per node) from --config, --mesh, --nodes, --seq_len."""
    from zaya_jax.config import ConfigError, load_config, validate
    from zaya_jax.parallel.mesh import AXES, parse_mesh_spec
    from zaya_jax.planning import gpu_target
    from zaya_jax.planning.abstract_step import planning_config

    config = _CONFIG.value if _CONFIG.value is not None else load_config("experiments/zaya1_tiny.py")
    try:
        mesh = parse_mesh_spec(FLAGS.mesh) if FLAGS.mesh else {a: int(config.mesh[a]) for a in AXES}
        nodes, gpus = gpu_target.topology_for(mesh, FLAGS.nodes, FLAGS.gpus_per_node)
        cfg, _ = planning_config(
            config,
            mesh=mesh,
            seq_len=FLAGS.seq_len,
            batch_per_device=FLAGS.batch_per_device or gpu_target.batch_per_shard(config, mesh, nodes * gpus),
            dispatch=None,
            num_devices=nodes * gpus,
        )
        validate(cfg)  # what launch.train would refuse (e.g. overlap_collectives without remat=full) is refused here
    except ConfigError as err:
        cli.fail(PROG, str(err))
    return cfg, nodes, gpus


def compile_targets(targets: list[str], out_dir: str | None) -> None:
    """Compile for each target in a child process (`launch.gpu_compile_job`), print its line, write the report."""
    from launch.gpu_compile_job import run_in_child
    from zaya_jax.config import ConfigError
    from zaya_jax.planning import gpu_report, gpu_target

    try:
        chosen = [gpu_target.get_target(t) for t in targets]
    except ConfigError as err:
        cli.fail(PROG, f"--compile: {err}")
    extra = tuple(FLAGS.xla_flags.split())
    bad = [f for f in extra if not f.startswith("--xla_")]
    if bad:
        cli.fail(PROG, f"--xla_flags: {bad[0]!r} is not an XLA flag; give space-separated --xla_...=value flags")
    for reason in dict.fromkeys(filter(None, (gpu_target.missing_extra(t.platform) for t in chosen))):
        cli.fail(PROG, reason)
    cfg, nodes, gpus = _compile_setup()  # bad input stops here, in this process, in one line
    results = []
    hlo_dir = make_out_dir(out_dir) if out_dir else None
    for target in chosen:
        results.append(run_in_child(cfg, target, nodes, gpus, hlo_dir, extra))
        print(results[-1]["line"], flush=True)
    if out_dir:
        setup = dict(nodes=nodes, gpus_per_node=gpus, seq_len=cfg.train.seq_len)
        setup |= dict(global_batch=cfg.train.global_batch_size, microbatches=cfg.train.microbatches)
        setup |= dict(remat=cfg.model.remat, dispatch=cfg.model.dispatch)
        command = "python -m launch.gpu_check " + shlex.join(sys.argv[1:])
        gpu_report.write(out_dir, results, command=command, setup=setup)
        print(f"{PROG}: wrote {out_dir}/report.md, report.json and <target>.hlo.txt (the scheduled HLO)", flush=True)
    if not all(r["ok"] and r["fits"] for r in results):
        sys.exit(cli.EXIT_FAILURE)


def main(argv: list[str]) -> None:
    del argv
    out_dir = cli.check_out_dir(PROG, FLAGS.out, "the report") if FLAGS.out else None
    if FLAGS.compile:
        compile_targets(FLAGS.compile, out_dir)
        return
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
        cli.fail(PROG, "give --out=DIR (the check and its report), --lower=rocm,cuda or --compile=h100,mi300x")
    from zaya_jax.bench.gpu_check.cases import FILL_CONFIGS

    configs = list(FILL_CONFIGS) if FLAGS.configs is None else FLAGS.configs
    unknown = sorted(set(configs) - set(FILL_CONFIGS))
    if unknown or not configs:
        cli.fail(PROG, f"--configs={','.join(configs)}: choose one or more of {', '.join(FILL_CONFIGS)}")
    cpu_devices.emulate(1, explicit=False)
    cli.compilation_cache("none")  # compile times are measured: no persistent-cache hits
    # This process only runs the small sections on the device; the train-step cases run in processes of their own
    # (zaya_jax/bench/gpu_check/__init__.py) and get the device memory as the user configured it.
    child_env = (("XLA_PYTHON_CLIENT_PREALLOCATE", os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")),)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # before the backend starts (`_has_gpu` starts it)
    if not FLAGS.smoke and not _has_gpu():  # the full check sizes its cases for one GPU's memory
        cli.fail(
            PROG,
            "no GPU on this host: the full check runs on one GPU; here use --smoke (CPU sizes), "
            "--lower=rocm,cuda or --compile=h100,mi300x",
        )
    make_out_dir(out_dir)

    from zaya_jax.bench.gpu_check import Options, run

    options = Options(
        out_dir=FLAGS.out,
        smoke=FLAGS.smoke,
        configs=tuple(configs),
        budget_s=FLAGS.budget_s,
        job_command=(sys.executable, "-m", "launch.gpu_check"),
        command="python -m launch.gpu_check " + shlex.join(sys.argv[1:]),
        child_env=child_env,
    )
    if run(options):
        sys.exit(cli.EXIT_FAILURE)


if __name__ == "__main__":
    cli.run(main, PROG)
