"""The peer comparisons' entry point (docs/benchmarks.md), run from the repository root:

    python -m benchmarks.peers --out=benchmarks/train                  # vs transformers, fp32 and bf16, MFU
    python -m benchmarks.peers --out=/tmp/peers --dtype=float32 --separate_runs=0 --quick

Per dtype (--dtype, else float32 and bfloat16): our train step against transformers `ZayaForCausalLM`, each
side alone in a fresh process (--separate_runs rounds, alternating; 0 = interleaved in one process), plus the
MaxText row outside quick runs (`suite`); ends with one ratio line per dtype. Writes train.csv / train.md /
train_rows.json (the machine and the exact command next to the results) into --out.

Like the launchers, it runs on one emulated CPU device by default (`--cpu_devices`; XLA:CPU splits the host's
threads between emulated devices) and re-executes itself once with glibc's huge-page tunable on a CPU-only host
(`zaya_jax.host_memory`; the transformers side runs with the default allocator). Errors are one line, exit 78.
"""

from zaya_jax import host_memory

host_memory.restart_with_huge_pages()  # before jax is imported; returns unless it re-executes

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "output directory for train.csv / train.md / train_rows.json")
flags.DEFINE_bool("quick", False, "small model and few steps (CPU smoke test)")
flags.DEFINE_string("dtype", None, "float32 | bfloat16 (default: both, each in a sub-directory of --out)")
config_flags.DEFINE_config_file(
    "config", None, "experiment config file[:arg] (default experiments/zaya1_100m.py); --config.x=... overrides"
)
flags.DEFINE_integer("batch", None, "global batch size override")
flags.DEFINE_integer("seq_len", None, "sequence length override")
flags.DEFINE_string("dispatch", None, "model.dispatch override (auto, grouped, ragged, capacity, ep, dense)")
flags.DEFINE_string("remat", None, "model.remat override")
flags.DEFINE_list("optimizers", None, "adamw (same as the reference) and/or muon (the project default)")
flags.DEFINE_bool("reference", True, "also time transformers ZayaForCausalLM (needs torch + transformers)")
flags.DEFINE_integer("trials", None, "timed steps per side")
flags.DEFINE_integer("warmup", None, "untimed steps per side (>= 1 incl. compilation)")
flags.DEFINE_integer(
    "separate_runs",
    2,
    "run each side alone in a fresh process, alternating, this many rounds (pooled; avoids in-process "
    "interference); 0 = interleave the two sides' steps in one process",
)
flags.DEFINE_enum("train_side", None, ["zaya_jax", "transformers"], "time only this side")
flags.DEFINE_string("maxtext_python", None, "python of a venv with MaxText installed (see benchmarks/README.md)")
cpu_devices.define_flag(1, "emulated CPU devices (default 1; 0 = as the environment says)")
cli.require_numbers("batch", "seq_len", "trials", "warmup", minimum=1)
cli.require_numbers("separate_runs", minimum=0)


def _config():
    """--config (validated), else experiments/zaya1_100m.py."""
    from zaya_jax.config import load_config, validate

    return validate(FLAGS.config) if FLAGS.config is not None else load_config("experiments/zaya1_100m.py")


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.out is None:
        cli.fail("peers", "--out is required, e.g. --out=benchmarks/train")
    import jax

    from benchmarks.peers import suite

    print(f"peers: backend={jax.default_backend()} devices={jax.device_count()} out={FLAGS.out}")
    options = suite.Options(
        out=FLAGS.out,
        dtypes=[FLAGS.dtype] if FLAGS.dtype else ["float32", "bfloat16"],
        quick=FLAGS.quick,
        batch=FLAGS.batch,
        seq_len=FLAGS.seq_len,
        dispatch=FLAGS.dispatch,
        remat=FLAGS.remat,
        trials=FLAGS.trials,
        warmup=FLAGS.warmup,
        optimizers=FLAGS.optimizers,
        reference=FLAGS.reference,
        separate_runs=FLAGS.separate_runs,
        train_side=FLAGS.train_side,
        maxtext_python=FLAGS.maxtext_python,
    )
    suite.run(options, _config())


if __name__ == "__main__":
    cli.run(main, "peers")
