r"""Evaluate a ZAYA1 model: held-out loss / bits per byte on prepared data, multiple-choice accuracy.

    python -m launch.eval --hf=/path/to/hf_dir --data=/data/prepared_a [--data=...] [--mc=items.jsonl]
    python -m launch.eval --checkpoint=/runs/x/ckpt --mc=items.jsonl --tokenizer=byte

Prints one JSON object: {"model", "data": {loss, bits_per_byte, ...}, "mc": {accuracy, accuracy_norm, items}}.
MC items are JSONL lines `{"context": str, "choices": [str, ...], "answer": int}`. The tokenizer comes from the
data manifest (byte data), --tokenizer, or the --hf directory's tokenizer.json (see zaya_jax.inference.evaluate).
"""

from __future__ import annotations

import json

from absl import flags

from launch import cli
from launch.model_flags import define_model_flags

FLAGS = flags.FLAGS
define_model_flags()
flags.DEFINE_multi_string("data", [], "prepared data directories (their eval splits are scored)")
flags.DEFINE_string("mc", None, "multiple-choice JSONL file")
flags.DEFINE_integer("batch_size", 8, "rows per evaluation batch", lower_bound=1)
flags.DEFINE_integer("max_batches", 0, "stop after this many batches (0 = the whole eval split)", lower_bound=0)
flags.DEFINE_boolean("show_scores", False, "include per-item choice scores in the MC summary")


def main(argv: list[str]) -> None:
    del argv
    from zaya_jax.inference import evaluate as ev
    from zaya_jax.inference.loading import default_tokenizer, load_model

    dirs = [d for spec in FLAGS.data for d in spec.split(",") if d]
    if not dirs and not FLAGS.mc:
        cli.fail("eval", "nothing to evaluate; pass --data=PREPARED_DIR and/or --mc=FILE.jsonl")
    _, model = load_model(FLAGS.hf, FLAGS.checkpoint, dtype=FLAGS.dtype, skip_output=FLAGS.skip_output)
    summary = {"model": FLAGS.hf or FLAGS.checkpoint}
    tok = None
    if dirs:
        tok = ev.data_tokenizer(dirs, FLAGS.tokenizer)
        summary["data"] = dict(
            ev.evaluate_loss(
                model, dirs, batch_size=FLAGS.batch_size, max_batches=FLAGS.max_batches or None, tokenizer=tok
            ),
            dirs=dirs,
        )
    if FLAGS.mc:
        tok = tok or default_tokenizer(FLAGS.tokenizer, FLAGS.hf)
        mc = ev.evaluate_mc(model, tok, ev.load_mc(FLAGS.mc))
        if not FLAGS.show_scores:
            mc.pop("scores")
        summary["mc"] = dict(mc, file=FLAGS.mc)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    cli.run(main, "eval")
