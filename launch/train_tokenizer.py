r"""Train a byte-level BPE tokenizer on local text and write its tokenizer.json.

    python -m launch.train_tokenizer --input=default --vocab_size=8192 --output=~/.cache/zaya_jax/bpe8k
    python -m launch.train --config=experiments/zaya1_100m.py --config.data.tokenizer=~/.cache/zaya_jax/bpe8k

`--input default` trains on the embedded default corpus (the Python standard library sources); otherwise
files, directories or globs as for `launch.prepare_data`. Pick `--vocab_size` ≤ the model's `vocab_size`.
An existing tokenizer at `--output` is reused when it is the one these inputs give, and never overwritten.
"""

from __future__ import annotations

from absl import flags

from launch import cli

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("input", None, "input files, directories or globs; 'default' = the embedded corpus")
flags.DEFINE_string("output", None, "tokenizer.json path, or a directory to write tokenizer.json into")
flags.DEFINE_integer("vocab_size", 8192, "ids in the tokenizer, special tokens included", lower_bound=1)
flags.DEFINE_string("text_key", "text", "text field of .jsonl records / .parquet column")
flags.DEFINE_integer("default_corpus_max_bytes", 8 * 2**20, "size cap of the default corpus")
flags.mark_flags_as_required(["input", "output"])


def main(argv: list[str]) -> None:
    del argv
    from zaya_jax.data import bpe, corpus

    inputs = corpus.input_files(FLAGS.input, FLAGS.default_corpus_max_bytes)
    tok = bpe.train_bpe(inputs, FLAGS.vocab_size, FLAGS.output, text_key=FLAGS.text_key)
    print(f"{tok.path}: {tok.raw_vocab_size} ids (eos {tok.eos_id}, pad {tok.pad_id}, bos {tok.bos_id})")


if __name__ == "__main__":
    cli.run(main, "train_tokenizer", jax_flags=False)
