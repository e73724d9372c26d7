"""Microbenchmark entry point (docs/benchmarks.md).

    python -m launch.bench --suite=collectives --out=/tmp/bench --quick
    python -m launch.bench --suite=gemm --out=/tmp/bench --dtype=bfloat16
    python -m launch.bench --suite=membw --out=/tmp/bench --min_bytes=1048576 --max_bytes=4294967296
    python -m launch.bench --suite=moe --out=benchmarks/moe                       # MoE / dense per dispatch
    python -m launch.bench --suite=compile --out=benchmarks/compile               # compile time vs depth
    python -m launch.bench --suite=checkpoint --out=benchmarks/checkpoint         # Orbax save vs raw disk
    python -m launch.bench --suite=data --out=benchmarks/data                     # preparation vs encode_batch

Every suite writes `<suite>.csv`, `<suite>.md` (the machine and the exact command next to the results) and
its plots into `--out`. `--config=file.py[:arg]` (with `--config.x=...` overrides) picks the model of the
moe / compile / checkpoint suites (default experiments/zaya1_100m.py).

CPU device emulation: `--cpu_devices=N` (`launch.cpu_devices`; default 8, 1 for the single-device suites
moe / compile / checkpoint; 0 = as the environment says) sets jax's CPU device count before the
backend starts; a count given on the command line wins over one in XLA_FLAGS.

The comparisons with peer stacks (our train step vs transformers and MaxText) are not a suite here: they live
in `benchmarks/peers/`, part of a checkout but not of the installed package, with their own entry point
(`python -m benchmarks.peers`, run from the repository root).

Suites live in the `SUITES` registry: add one with `register_suite("name", "help")` on a
function `(flags.FlagValues) -> None`; no other change is needed.
"""

from __future__ import annotations

from collections.abc import Callable

from launch.cpu_devices import prepare_host

prepare_host()

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402

# Single-device suites default to 1 emulated device: XLA:CPU splits the host's threads between emulated
# devices, so a one-device computation runs ~3x slower on a 2-core host with 8 emulated devices.
ONE_DEVICE_SUITES = ("moe", "compile", "checkpoint")

Runner = Callable[[flags.FlagValues], None]
SUITES: dict[str, tuple[Runner, str]] = {}


def register_suite(name: str, help_text: str) -> Callable[[Runner], Runner]:
    """Decorator: make `fn(FLAGS)` available as `--suite=name`."""

    def deco(fn: Runner) -> Runner:
        SUITES[name] = (fn, help_text)
        return fn

    return deco


def _dtype(f: flags.FlagValues):
    import jax.numpy as jnp

    from zaya_jax.bench import common

    return jnp.dtype(f.dtype or common.default_float_dtype())


@register_suite(
    "collectives",
    "all-reduce, reduce-scatter, all-gather, broadcast (emulated), "
    "all-to-all, ppermute vs message size and device count",
)
def _run_collectives(f: flags.FlagValues) -> None:
    import jax.numpy as jnp

    from zaya_jax.bench import collectives

    names = f.collectives or list(collectives.COLLECTIVES)
    counts = [int(c) for c in f.device_counts] if f.device_counts else None
    if f.quick:
        min_b, max_b, warmup, trials = 1 << 10, 1 << 16, 1, 3
    else:
        min_b, max_b, warmup, trials = 1 << 10, 1 << 26, 2, 10
    collectives.run(
        f.out,
        names=names,
        device_counts=counts or collectives.default_device_counts(),
        min_bytes=f.min_bytes or min_b,
        max_bytes=f.max_bytes or max_b,
        dtype=jnp.dtype(f.dtype) if f.dtype else jnp.float32,
        warmup=f.warmup if f.warmup is not None else warmup,
        trials=f.trials or trials,
    )


@register_suite("gemm", "achieved TFLOP/s: square, ZAYA1 shapes, unaligned sizes, grouped expert GEMM")
def _run_gemm(f: flags.FlagValues) -> None:
    import jax

    from zaya_jax.bench import gemm

    kwargs: dict = dict(
        dtype=_dtype(f), warmup=f.warmup if f.warmup is not None else 2, trials=f.trials or 5, tokens=f.gemm_tokens
    )
    if f.quick:
        cpu = jax.default_backend() == "cpu"
        kwargs.update(
            square=(64, 128, 256) if cpu else (1024, 4096, 8192),
            tokens=f.gemm_tokens or (32 if cpu else 4096),
            unaligned_bases=(128,) if cpu else (2048,),
            grouped=(128, 128, 256, 4) if cpu else (8192, 2048, 4096, 16),
            max_gflop=f.max_gflop or (2.0 if cpu else None),
            warmup=1 if f.warmup is None else f.warmup,
            trials=f.trials or 3,
        )
    elif f.max_gflop:
        kwargs["max_gflop"] = f.max_gflop
    gemm.run(f.out, **kwargs)


@register_suite("membw", "copy / scale / triad bandwidth vs array size")
def _run_membw(f: flags.FlagValues) -> None:
    from zaya_jax.bench import membw

    min_b, max_b = (1 << 16, 1 << 22) if f.quick else (1 << 20, None)
    membw.run(
        f.out,
        min_bytes=f.min_bytes or min_b,
        max_bytes=f.max_bytes or max_b,
        dtype=_dtype(f),
        warmup=f.warmup if f.warmup is not None else (1 if f.quick else 2),
        trials=f.trials or (3 if f.quick else 10),
    )


def _bench_config(f: flags.FlagValues, default: str, *, quick_model: bool = False):
    """--config (validated), else the config file `default` (a path under experiments/); `quick_model`: a
    validated copy with the bench's tiny model."""
    from zaya_jax.config import load_config, validate

    config = validate(f.config) if f.config is not None else load_config(default)
    if not quick_model:
        return config
    from zaya_jax.bench.inputs import quick_model

    config = config.copy_and_resolve_references()
    config.model.update(quick_model())
    return validate(config)


@register_suite("moe", "MoE block / dense SwiGLU of equal active FLOPs per dispatch (forward + backward)")
def _run_moe(f: flags.FlagValues) -> None:
    from zaya_jax.bench import common, moe

    config = _bench_config(f, "experiments/zaya1_100m.py", quick_model=f.quick)
    tokens = f.tokens or (256 if f.quick else config.train.global_batch_size * config.train.seq_len)
    moe.run(
        f.out,
        config.model,
        tokens,
        command=common.command_line(),
        dispatches=f.dispatches or moe.DISPATCHES,
        capacity_factors=[float(x) for x in f.capacity_factors]
        if f.capacity_factors
        else ([] if f.quick else [2.0, 1.25]),
        # 2 warm-ups and 11 trials: with 1 and 5, single runs on a 2-core VM read up to 2x the median of others
        warmup=f.warmup if f.warmup is not None else (1 if f.quick else 2),
        trials=f.trials or (2 if f.quick else 11),
    )


@register_suite(
    "compile", "train-step compile time vs depth (8, 40, 80 layers) for a small-width config (the planner's check)"
)
def _run_compile(f: flags.FlagValues) -> None:
    from zaya_jax.bench import common
    from zaya_jax.bench import compile as compile_bench

    depths = [int(d) for d in f.depths] if f.depths else ([2, 4] if f.quick else [8, 40, 80])
    compile_bench.run(
        f.out,
        _bench_config(f, "experiments/zaya1_100m.py"),
        command=common.command_line(),
        depths=depths,
        **(dict(batch=2, seq=32) if f.quick else {}),
    )


@register_suite("checkpoint", "Orbax checkpoint save throughput vs raw sequential writes (fsync) to the same disk")
def _run_checkpoint(f: flags.FlagValues) -> None:
    from zaya_jax.bench import ckpt, common

    config = _bench_config(f, "experiments/zaya1_100m.py", quick_model=f.quick)
    ckpt.run(
        f.out,
        config,
        command=common.command_line(),
        directory=f.ckpt_dir,
        trials=f.trials or (2 if f.quick else 3),
        optimizer=(f.optimizers or ["muon"])[0],
    )


@register_suite("data", "data preparation tokens/s vs tokenizers' encode_batch per core, 1..all workers, loader rows/s")
def _run_data(f: flags.FlagValues) -> None:
    from zaya_jax.bench import common, data

    data.run(
        f.out,
        max_bytes=f.max_bytes or (2 if f.quick else 32) * 2**20,
        rounds=f.trials or (1 if f.quick else 3),
        cache_dir="~/.cache/zaya_jax/bench",
        command=common.command_line(),
    )


FLAGS = flags.FLAGS
flags.DEFINE_string(
    "suite",
    None,
    "benchmark suite, one of the SUITES registry: " + "; ".join(f"{k}: {v[1]}" for k, v in SUITES.items()),
)
flags.DEFINE_string("out", None, "output directory for CSV / PNG / JSON")
flags.DEFINE_bool("quick", False, "small sweep (CPU smoke test; collectives < 2 min on 2 cores)")
flags.DEFINE_integer("min_bytes", None, "smallest message / array size in bytes (power of two)")
flags.DEFINE_integer("max_bytes", None, "largest message / array size in bytes")
flags.DEFINE_integer("trials", None, "timed iterations per measurement")
flags.DEFINE_integer("warmup", None, "untimed iterations per measurement (>= 1 incl. compilation)")
flags.DEFINE_string("dtype", None, "float32 | bfloat16 (default: bf16 on GPU, f32 on CPU; collectives: float32)")
flags.DEFINE_list("device_counts", None, "collectives: device counts (default 2, 4, 8, ... up to all)")
flags.DEFINE_list(
    "collectives",
    None,
    "collectives: subset of all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, ppermute",
)
flags.DEFINE_integer("gemm_tokens", None, "gemm: tokens per device T for the ZAYA1 shapes")
flags.DEFINE_float("max_gflop", None, "gemm: skip shapes above this many GFLOP")
config_flags.DEFINE_config_file(
    "config",
    None,
    "moe/compile/checkpoint: experiment config file[:arg] "
    "(default experiments/zaya1_100m.py); --config.x=... overrides",
)
flags.DEFINE_list("optimizers", None, "checkpoint: the optimizer whose state is saved (the first; default muon)")
flags.DEFINE_integer("tokens", None, "moe: tokens T per block call (default batch x seq of the config)")
flags.DEFINE_list("dispatches", None, "moe: subset of dropless:loops, dropless:ragged_dot, capacity, ep, dense")
flags.DEFINE_list("capacity_factors", None, "moe: capacity factors for capacity / ep (default 2.0, 1.25)")
flags.DEFINE_list("depths", None, "compile: layer counts (default 8, 40, 80)")
flags.DEFINE_string("ckpt_dir", None, "checkpoint: directory on the disk to measure (default: the temp dir)")
cpu_devices.define_flag(
    None,
    "emulated CPU devices (default 8, 1 for the moe/compile/checkpoint "
    "suites; 0 = as the environment says; wins over XLA_FLAGS' device count when given)",
)
flags.DEFINE_string("coordinator_address", None, "multi-process: jax.distributed coordinator host:port")
flags.DEFINE_integer("num_processes", None, "multi-process: number of processes")
flags.DEFINE_integer("process_id", None, "multi-process: this process's id")
# every number checked while the flags are parsed (one line, exit 78), before anything is compiled
cli.require_numbers(
    "min_bytes",
    "max_bytes",
    "trials",
    "warmup",
    "gemm_tokens",
    "tokens",
    "num_processes",
    minimum=1,
)
cli.require_numbers("process_id", minimum=0)
cli.require_numbers("max_gflop", above=0)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.suite not in SUITES:
        cli.fail("bench", f"--suite={FLAGS.suite!r}; choose one of {sorted(SUITES)}")
    if FLAGS.out is None:
        cli.fail("bench", "--out is required, e.g. --out=benchmarks/" + FLAGS.suite)
    cli.check_out_dir("bench", FLAGS.out, "the results")
    if FLAGS.cpu_devices is None:
        cpu_devices.emulate(1 if FLAGS.suite in ONE_DEVICE_SUITES else 8, explicit=False)
    if FLAGS.suite == "compile":
        cli.compilation_cache("none")  # compile times are what it measures: no persistent cache hits
    import jax

    if FLAGS.coordinator_address:
        jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    if jax.process_index() == 0:
        print(
            f"suite={FLAGS.suite} backend={jax.default_backend()} devices={jax.device_count()} "
            f"processes={jax.process_count()} out={FLAGS.out}"
        )
    SUITES[FLAGS.suite][0](FLAGS)


if __name__ == "__main__":
    flags.mark_flag_as_required("suite")
    cli.run(main, "bench")
