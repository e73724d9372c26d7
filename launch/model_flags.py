"""Flags shared by the launchers that load a trained model (`launch.generate`, `launch.eval`):
where the model comes from and how an HF directory is read. Pass them to
`zaya_jax.inference.loading.load_model(FLAGS.hf, FLAGS.checkpoint, dtype=..., skip_output=...)`."""

from absl import flags

from zaya_jax.config import DTYPES, SKIP_OUTPUTS


def define_model_flags() -> None:
    flags.DEFINE_string("hf", None, "transformers checkpoint directory (config.json + *.safetensors)")
    flags.DEFINE_string("checkpoint", None, "zaya_jax training checkpoint directory")
    flags.DEFINE_string(
        "tokenizer",
        None,
        "'byte' or a tokenizer.json path (default: the --hf directory's "
        "tokenizer.json, else byte; needed for data prepared with one)",
    )
    flags.DEFINE_enum("dtype", None, list(DTYPES), "parameter/compute dtype for --hf (default fp32)")
    flags.DEFINE_enum("skip_output", "zero", list(SKIP_OUTPUTS), "skip-slot semantics for --hf (spec §7)")
