r"""Train a byte-level BPE tokenizer on local text and write its tokenizer.json.

    python -m launch.train_tokenizer --input=default --vocab_size=8192 --output=~/.cache/zaya_jax/bpe8k
    python -m launch.train --config=experiments/zaya1_100m.py --config.data.tokenizer=~/.cache/zaya_jax/bpe8k

`--input default` trains on the embedded default corpus (the Python standard library sources); otherwise
files, directories or globs as for `launch.prepare_data`. Pick `--vocab_size` ≤ the model's `vocab_size`.
An existing tokenizer at `--output` is reused when it is the one these inputs give, and never overwritten.
An empty corpus, an `--output` that is some other existing file and a `--vocab_size` above MAX_VOCAB are
usage errors (one line, exit 78), found before any training.
"""

from __future__ import annotations

import os

from absl import flags

from launch import cli

# ids the trainer allocates tables for up front (the tokenizers library reserves memory per id, ~72 bytes:
# 2^24 ids ≈ 1.2 GB); real vocabularies stay far below (ZAYA1: 262,272)
MAX_VOCAB = 2**24
FLAGS = flags.FLAGS
flags.DEFINE_multi_string("input", None, "input files, directories or globs; 'default' = the embedded corpus")
flags.DEFINE_string("output", None, "tokenizer.json path, or a directory to write tokenizer.json into")
flags.DEFINE_integer(
    "vocab_size", 8192, "ids in the tokenizer, special tokens included", lower_bound=1, upper_bound=MAX_VOCAB
)
flags.DEFINE_string("text_key", "text", "text field of .jsonl records / .parquet column")
flags.DEFINE_integer("default_corpus_max_bytes", 8 * 2**20, "size cap of the default corpus", lower_bound=1)
flags.mark_flags_as_required(["input", "output"])


def main(argv: list[str]) -> None:
    del argv
    from zaya_jax.data import bpe, corpus

    _check_output(FLAGS.output)
    inputs = corpus.input_files(FLAGS.input, FLAGS.default_corpus_max_bytes)
    _check_has_text(inputs, FLAGS.text_key)
    tok = bpe.train_bpe(inputs, FLAGS.vocab_size, FLAGS.output, text_key=FLAGS.text_key)
    print(f"{tok.path}: {tok.raw_vocab_size} ids (eos {tok.eos_id}, pad {tok.pad_id}, bos {tok.bos_id})")


def _check_output(output: str) -> None:
    """--output names a tokenizer.json (new or existing) or a directory: never some other existing file."""
    path = os.path.expanduser(output)
    if os.path.isfile(path) and not path.endswith(".json"):
        cli.fail("train_tokenizer", f"--output={output} is an existing file; pass a new directory or a .json path")
    parent = os.path.dirname(os.path.abspath(path if path.endswith(".json") else os.path.join(path, "x")))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        cli.fail("train_tokenizer", f"--output={output}: {parent} is a file, not a directory; pass another path")


def _check_has_text(inputs: list[str], text_key: str) -> None:
    """The inputs hold at least one non-blank document (as launch.prepare_data requires)."""
    from zaya_jax.data.inputs import expand_inputs, iter_documents

    files = expand_inputs(inputs)
    if files and next(iter_documents(files, text_key), None) is None:
        cli.fail("train_tokenizer", "the inputs contain no documents (all files empty or blank); check --input")


if __name__ == "__main__":
    cli.run(main, "train_tokenizer", jax_flags=False)
