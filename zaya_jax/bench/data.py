"""Data preparation throughput against the tokenizer's own limit, its scaling over cores, and the loader's rate.

Method: the embedded corpus (the Python standard library's `.py` files, one document each, repeated up to the
size asked for) is written as JSONL files; a byte-level BPE of 32,768 ids is trained on the default embedded
corpus (`launch.train_tokenizer`, cached). Every measurement runs in its own fresh process, in rounds (each side
once per round), with `RAYON_NUM_THREADS=1` so that a process uses one core for tokenizing:

* `encode_batch`: the `tokenizers` library's `Tokenizer.encode_batch` on the same texts (already in memory, in
  batches of 64 like the preparation), pinned to one core (`os.sched_setaffinity`) — the limit of this step;
* `prepare, k workers`: `zaya_jax.data.prepare.prepare` of the JSONL files at seq_len 4096 (reading, JSON
  parsing, tokenizing, packing, writing shards, manifest; the worker pool's start-up for k > 1), pinned to k
  cores, for k = 1 .. the cores this process may use.

Token rates count the reference's tokens (eos and padding excluded) for every side, so a ratio of rates is the
inverse ratio of times on the same text. The outputs of 1 and k workers are compared file by file.

The loader: the training iterator (`zaya_jax.data.pipeline`, shuffled, one host of 128 taking its slice of the
global batch) over the 1-worker output; rows/s against what one step of the paper's layout needs per host —
data:1024 with 8 micro-batches of one 4096-token row per GPU = 8,192 rows per step over 128 hosts of 8 GPUs
= 64 rows per host, every 0.91 s (the projected step time, benchmarks/plan_zero1).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BPE_VOCAB = 32_768
SEQ_LEN = 4096
HOSTS, ROWS_PER_HOST_STEP, STEP_SECONDS = 128, 64, 0.91
ENCODE_BATCH = 64
JSONL_FILES = 4
TASKS = 16


# ----------------------------------------------------------------------------- inputs
def bench_tokenizer(cache_dir: str) -> str:
    """tokenizer.json of a 32,768-id BPE trained on the default embedded corpus (trained once, then cached)."""
    from zaya_jax.data import bpe, corpus

    path = os.path.join(os.path.expanduser(cache_dir), f"bpe{BPE_VOCAB}", "tokenizer.json")
    if not os.path.exists(path):
        bpe.train_bpe(corpus.stdlib_files(), BPE_VOCAB, path)
    return path


def write_corpus(directory: str, max_bytes: int) -> list[str]:
    """About `max_bytes` of standard-library files as `JSONL_FILES` JSONL files of one record per file (the files
    are repeated when the library holds less; repeats cost the tokenizer as much as new text)."""
    from zaya_jax.data import corpus

    texts = []
    for name in corpus.stdlib_files(max_bytes):
        with open(name, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    have = sum(len(t) for t in texts)
    texts = texts * max(1, round(max_bytes / max(have, 1)))
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"part-{i}.jsonl") for i in range(JSONL_FILES)]
    for i, path in enumerate(paths):
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": t}) + "\n" for t in texts[i::JSONL_FILES])
    return paths


# ----------------------------------------------------------------------------- the measured sides (child processes)
def _pin(cores: int) -> None:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])


def child_encode(paths: list[str], tokenizer: str) -> dict:
    """Seconds and tokens of `encode_batch` over the texts of `paths`, on one core."""
    import tokenizers

    _pin(1)
    texts = [json.loads(line)["text"] for p in paths for line in open(p, encoding="utf-8")]
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), ENCODE_BATCH):
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + ENCODE_BATCH], add_special_tokens=False))
    return dict(seconds=time.perf_counter() - t0, tokens=tokens)


def child_prepare(paths: list[str], tokenizer: str, out: str, workers: int, task_bytes: int) -> dict:
    """Seconds of a whole preparation of `paths` with `workers` processes on as many cores."""
    from zaya_jax.data import prepare

    _pin(workers)
    t0 = time.perf_counter()
    m = prepare.prepare(
        paths, out, seq_len=SEQ_LEN, tokenizer=tokenizer, task_bytes=task_bytes, workers=workers, progress=False
    )
    return dict(seconds=time.perf_counter() - t0, rows=m["num_rows"], tasks=m["num_tasks"])


def _in_child(fn: str, **kwargs) -> dict:
    code = (
        "import json, sys; from zaya_jax.bench import data; "
        f"print('RESULT ' + json.dumps(data.{fn}(**json.loads(sys.argv[1]))))"
    )
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="true")
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(kwargs)], env=env, capture_output=True, text=True, check=False
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"benchmark child {fn} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# ----------------------------------------------------------------------------- loader
def loader_rows_per_second(prepared: str, steps: int = 30) -> float:
    """Rows/s one host of `HOSTS` gets from the training iterator (its slice of 64-row-per-host steps)."""
    from zaya_jax.data import pipeline

    it = pipeline.make_train_iterator([prepared], seed=0, process_index=0, process_count=HOSTS)
    it.next_batch(HOSTS * ROWS_PER_HOST_STEP)  # opens the shards
    t0 = time.perf_counter()
    for _ in range(steps):
        it.next_batch(HOSTS * ROWS_PER_HOST_STEP)
    return steps * ROWS_PER_HOST_STEP / (time.perf_counter() - t0)


def same_files(a: str, b: str) -> bool:
    """Whether two prepared dirs hold byte-identical files (the engine's logs and the lock aside)."""

    def listing(root):
        found = {}
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x != ".datatrove"]
            for f in files:
                if not f.endswith(".lock"):
                    with open(os.path.join(d, f), "rb") as fh:
                        found[os.path.relpath(os.path.join(d, f), root)] = fh.read()
        return found

    return listing(a) == listing(b)


# ----------------------------------------------------------------------------- the suite
def benchmark(*, max_bytes: int, rounds: int, cache_dir: str, log=print) -> tuple[list[dict], dict]:
    """Rows of the report (one per side) and the headline numbers."""
    tokenizer = bench_tokenizer(cache_dir)
    cores = len(os.sched_getaffinity(0))
    work = tempfile.mkdtemp(prefix="zaya_data_bench_")
    try:
        paths = write_corpus(os.path.join(work, "in"), max_bytes)
        total = sum(os.path.getsize(p) for p in paths)
        task_bytes = -(-total // TASKS)
        times: dict[str, list[float]] = {}
        tokens = 0
        for r in range(rounds):
            enc = _in_child("child_encode", paths=paths, tokenizer=tokenizer)
            tokens = enc["tokens"]
            times.setdefault("encode_batch", []).append(enc["seconds"])
            for k in range(1, cores + 1):
                out = os.path.join(work, f"out-{k}")
                shutil.rmtree(out, ignore_errors=True)
                res = _in_child(
                    "child_prepare", paths=paths, tokenizer=tokenizer, out=out, workers=k, task_bytes=task_bytes
                )
                times.setdefault(f"prepare, {k} workers", []).append(res["seconds"])
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
        identical = all(
            same_files(os.path.join(work, "out-1"), os.path.join(work, f"out-{k}")) for k in range(2, cores + 1)
        )
        loader = loader_rows_per_second(os.path.join(work, "out-1"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for side, ts in times.items():
        k = 1 if side == "encode_batch" else int(side.split(", ")[1].split()[0])
        med = statistics.median(ts)
        rows.append(
            dict(
                side=side,
                cores=k,
                min_s=min(ts),
                median_s=med,
                tokens=tokens,
                tok_per_s=tokens / med,
                tok_per_s_per_core=tokens / med / k,
            )
        )
    by = {r["side"]: r for r in rows}
    enc, one = by["encode_batch"], by["prepare, 1 workers"]
    top = by[f"prepare, {min(cores, 2)} workers"]
    head = dict(
        per_core=enc["median_s"] / one["median_s"],
        per_core_min=enc["min_s"] / one["min_s"],
        scaling=one["median_s"] / top["median_s"],
        scaling_min=one["min_s"] / top["min_s"],
        scaling_workers=min(cores, 2),
        identical=identical,
        loader_rows_per_s=loader,
        needed_rows_per_s=ROWS_PER_HOST_STEP / STEP_SECONDS,
        input_bytes=total,
        tokens=tokens,
        tasks=TASKS,
    )
    return rows, head


def _plots(out_dir: str, rows: list[dict]) -> list[str]:
    from zaya_jax.bench import common

    name = "data.png"
    common.plot_bars(
        os.path.join(out_dir, name),
        {
            "tokens/s (median)": {"all cores used": [(r["side"], r["tok_per_s"]) for r in rows]},
            "tokens/s per core (median)": {"per core": [(r["side"], r["tok_per_s_per_core"]) for r in rows]},
        },
        ylabel="tokens / s",
        title="Preparation vs tokenizers' encode_batch (one core each), and its scaling",
    )
    return [name]


def headline(head: dict) -> list[str]:
    """The report's closing lines."""
    return [
        f"outputs of 1 and {head['scaling_workers']} workers byte-identical: {'yes' if head['identical'] else 'NO'}",
        f"loader rows/s per host: {head['loader_rows_per_s']:,.0f} (one step at data:1024 needs "
        f"{ROWS_PER_HOST_STEP} rows per host every {STEP_SECONDS} s = {head['needed_rows_per_s']:.0f} rows/s: "
        f"{head['loader_rows_per_s'] / head['needed_rows_per_s']:,.0f}x)",
        f"preparation / encode_batch (per core): {head['per_core']:.2f}x",
        f"preparation {head['scaling_workers']} workers / 1 worker: {head['scaling']:.2f}x",
    ]


def run(out_dir: str, *, max_bytes: int, rounds: int, cache_dir: str, command: str | None = None) -> list[dict]:
    from zaya_jax.bench import common

    load_before = os.getloadavg()[0]
    rows, head = benchmark(max_bytes=max_bytes, rounds=rounds, cache_dir=cache_dir, log=common.say)
    setup = (
        f"{head['input_bytes'] / 2**20:.1f} MiB of JSONL ({JSONL_FILES} files), {head['tokens']:,} tokens of a "
        f"{BPE_VOCAB:,}-id BPE, {head['tasks']} tasks, {rounds} rounds; 1-minute load average {load_before:.2f} "
        f"before the run, {os.getloadavg()[0]:.2f} after it\n\n" + __doc__.split("\n\n", 1)[1]
    )
    notes = [
        f"by min time: per core {head['per_core_min']:.2f}x, {head['scaling_workers']} workers / 1 "
        f"{head['scaling_min']:.2f}x",
        *headline(head),
    ]
    common.report(
        out_dir,
        "data",
        rows,
        title="Data preparation throughput",
        table_columns=["side", "cores", "min_s", "median_s", "tok_per_s", "tok_per_s_per_core"],
        sections=[("Setup", setup)],
        notes=notes,
        plots=lambda d: _plots(d, rows),
        command=command,
    )
    for line in headline(head)[-2:]:
        print(line)
    return rows
