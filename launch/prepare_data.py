r"""Tokenize and pack text into memory-mapped training shards.

    python -m launch.prepare_data --input data/*.jsonl --input notes/ --output /data/mix_a \
        --tokenizer byte --seq_len 4096

Inputs: files, directories (recursive) or globs; .txt/.md/.py/.rst/... are one document per
file, .jsonl one document per line (field --text_key), .parquet (needs pyarrow) one per row.
`--input default` prepares the embedded default corpus (the Python standard library sources).
A rerun with the same flags resumes / does nothing; a directory holding other data is refused. Files that
are largely not UTF-8 text (binary data) are prepared with a warning naming them.

Parallel: the inputs are cut into tasks of --task_bytes (by file, and by byte range for large JSONL files);
--workers processes run them on this machine (datatrove's executor; default: all cores). On several machines
(a SLURM array: launch/slurm/prepare_data.sbatch) each runs with --num_nodes=N --node_rank=i and takes its
share of the tasks; the last to finish writes the manifest. The output does not depend on --workers or
--num_nodes.
"""

from __future__ import annotations

from absl import flags

from launch import cli

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "input",
    None,
    "input files, directories or globs (repeat or comma-separate); 'default' = the Python standard library corpus",
)
flags.DEFINE_string("output", None, "output directory")
flags.DEFINE_string("tokenizer", "byte", "'byte' or a path to a Hugging Face tokenizer.json")
flags.DEFINE_integer("seq_len", 4096, "training sequence length (rows hold seq_len + 1 tokens)", lower_bound=1)
flags.DEFINE_integer("shard_size", 2048, "rows per shard", lower_bound=1)
flags.DEFINE_string("text_key", "text", "text field of .jsonl records / .parquet column")
flags.DEFINE_float("eval_fraction", 0.02, "fraction of rows (the last ones) held out for evaluation")
flags.DEFINE_integer("vocab_size", 0, "force the vocab size (0 = the tokenizer's, padded to a multiple of 128)")
flags.DEFINE_integer("default_corpus_max_bytes", 8 * 2**20, "size cap of the default corpus")
flags.DEFINE_integer("workers", 0, "worker processes on this machine (0 = one per core it may use)", lower_bound=0)
flags.DEFINE_integer("task_bytes", 0, "input bytes per task (0 = automatic: ~64 tasks, 1-256 MiB each)", lower_bound=0)
flags.DEFINE_integer("num_nodes", 1, "machines sharing the tasks (a SLURM array's task count)", lower_bound=1)
flags.DEFINE_integer("node_rank", 0, "this machine's index in [0, num_nodes) (SLURM_ARRAY_TASK_ID)", lower_bound=0)
flags.mark_flags_as_required(["input", "output"])


def main(argv: list[str]) -> None:
    del argv
    import os

    from zaya_jax.data import corpus, prepare

    inputs = corpus.input_files(FLAGS.input, FLAGS.default_corpus_max_bytes)
    manifest = prepare.prepare(
        inputs,
        FLAGS.output,
        seq_len=FLAGS.seq_len,
        tokenizer=FLAGS.tokenizer,
        shard_size=FLAGS.shard_size,
        text_key=FLAGS.text_key,
        eval_fraction=FLAGS.eval_fraction,
        vocab_size=FLAGS.vocab_size or None,
        task_bytes=FLAGS.task_bytes or None,
        workers=FLAGS.workers or len(os.sched_getaffinity(0)),
        num_nodes=FLAGS.num_nodes,
        node_rank=FLAGS.node_rank,
    )
    if manifest is None:
        print(
            f"{FLAGS.output}: machine {FLAGS.node_rank} of {FLAGS.num_nodes} finished its tasks; the last machine "
            "to finish writes manifest.json (rerun any one of them to check)"
        )
        return
    train, held = manifest["splits"]["train"], manifest["splits"]["eval"]
    print(
        f"{FLAGS.output}: {manifest['num_documents']} documents, {manifest['num_tokens']} tokens, "
        f"{manifest['num_rows']} rows of {manifest['seq_len']}+1 in {len(manifest['shards'])} shards "
        f"(train {train[1] - train[0]}, eval {held[1] - held[0]}), vocab {manifest['vocab_size']}, "
        f"tokenizer {manifest['tokenizer']['name']}"
    )


if __name__ == "__main__":
    cli.run(main, "prepare_data")
