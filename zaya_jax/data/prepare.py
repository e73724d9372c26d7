"""Offline preparation: tokenize documents, pack them into fixed-length rows, write `.npy` shards — in parallel.

The inputs are cut into tasks (`zaya_jax.data.tasks`: by file, and by byte range for large JSONL files); each
task tokenizes and packs its documents independently into its own directory (`zaya_jax.data.packing`); tasks
run in this process, on N local worker processes, or spread over machines (`zaya_jax.data.parallel`, on
datatrove's executor); the last one to finish merges the tasks' counts into the manifest. Layout of a prepared
directory (all rows have `row_len = seq_len + 1` tokens: inputs + the label shifted by one):

    prepare.json                        the preparation config (written first)
    task-000000/shard-00000.tokens.npy  [rows, row_len] token ids, ... (see `zaya_jax.data.packing`)
    task-000000/done.json               the task is complete
    .datatrove/                         the engine's completion marks, task logs and stats
    manifest.json                       written last: counts, shard list (task order), train/eval split

The rows are the tasks' rows in task order, a deterministic function of the inputs and `task_bytes`: one worker,
16 workers or 16 machines write byte-identical files. A rerun with the same configuration redoes only incomplete
tasks (an interrupted task resumes after its last complete shard); a directory holding anything else is never
overwritten (and a refused directory is left untouched, without a lock file). A preparation that fails on bad
input, started in an empty directory on one machine, removes what it wrote (its lock file and a directory it
created included), so a rerun with the input fixed starts clean and the user's folders are as they were. Input
files are found and read by `zaya_jax.data.inputs` (which warns about files that are mostly not text).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from typing import Sequence

import numpy as np

from zaya_jax.data import packing
from zaya_jax.data.inputs import expand_inputs
from zaya_jax.data.packing import read_json, write_json
from zaya_jax.data.parallel import ENGINE_DIR, TaskStep, run_tasks
from zaya_jax.data.tasks import default_task_bytes, plan_tasks
from zaya_jax.data.tokenizer import DataError, Tokenizer, load_tokenizer

FORMAT = "zaya_jax.packed.v2"
READABLE_FORMATS = ("zaya_jax.packed.v1", FORMAT)  # v1: one stream of shards at the top level; read the same way
MANIFEST, CONFIG, LOCK = "manifest.json", "prepare.json", ".prepare.lock"


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as e:
        raise DataError(f"cannot read input {path}: {e.strerror or e}; check the path and permissions") from e


def _fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(output_dir: str):
    with open(os.path.join(output_dir, LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _check_output_dir(out: str, config: dict, fp: str) -> dict | None:
    """The finished manifest if `out` already holds this preparation; raise if it holds anything else.

    The directory is listed before prepare.json is looked for: another machine starting the same preparation
    writes prepare.json before anything else, so what it wrote never reads as foreign files."""
    listing = os.listdir(out)
    for name in (MANIFEST, CONFIG):
        path = os.path.join(out, name)
        if os.path.exists(path):
            old = read_json(path)
            if old.get("config_fingerprint") != fp:
                oc = old.get("config", {})
                diff = sorted(k for k in set(oc) | set(config) if oc.get(k) != config.get(k)) or ["format"]
                raise DataError(
                    f"output dir {out} holds a different preparation (differs in {diff}); "
                    "choose another --output or delete that directory"
                )
            if name == MANIFEST:
                return old
            return None
    others = [e for e in listing if e not in (LOCK, ENGINE_DIR) and not e.endswith(".tmp")]
    if others:
        raise DataError(
            f"output dir {out} is not empty and holds no zaya_jax preparation "
            f"(found {others[:3]}); choose an empty or new directory"
        )
    return None


def _check_args(seq_len: int, shard_size: int, eval_fraction: float, workers: int, num_nodes: int, node_rank: int):
    if seq_len < 1 or shard_size < 1 or not 0.0 <= eval_fraction < 1.0:
        raise DataError(
            f"need seq_len >= 1, shard_size >= 1 and 0 <= eval_fraction < 1; got "
            f"{seq_len}, {shard_size}, {eval_fraction}"
        )
    if workers < 1 or not 0 <= node_rank < num_nodes:
        raise DataError(
            f"need workers >= 1 and 0 <= node_rank < num_nodes; got workers={workers}, "
            f"node_rank={node_rank}, num_nodes={num_nodes}"
        )


def _make_dir(output_dir: str) -> None:
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DataError(f"output {output_dir} exists and is not a directory; choose a directory path")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create output directory {output_dir}: {e.strerror}") from e


def _remove_preparation(out: str) -> None:
    """Remove what a failed first run wrote (only the names a preparation writes)."""
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name.startswith("task-") or name == ENGINE_DIR:
            shutil.rmtree(path, ignore_errors=True)
        elif name == CONFIG:
            os.remove(path)


def _remove_own(out: str, created: bool, had_lock: bool) -> None:
    """After a failure or refusal: remove the lock file this run created, and `out` itself if this run created it
    and it is empty again, so the user's folders are as they were."""
    if not had_lock:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(out, LOCK))
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(out)  # only when empty


def node_tasks(num_tasks: int, num_nodes: int, node_rank: int) -> range:
    """The contiguous share of tasks [0, num_tasks) that machine `node_rank` of `num_nodes` runs."""
    return range(num_tasks * node_rank // num_nodes, num_tasks * (node_rank + 1) // num_nodes)


def prepare(
    inputs: Sequence[str],
    output_dir: str,
    *,
    seq_len: int,
    tokenizer: "str | Tokenizer" = "byte",
    shard_size: int = 2048,
    text_key: str = "text",
    eval_fraction: float = 0.02,
    vocab_size: int | None = None,
    progress: bool = True,
    task_bytes: int | None = None,
    workers: int = 1,
    num_nodes: int = 1,
    node_rank: int = 0,
) -> dict | None:
    """Tokenize and pack `inputs` into `output_dir`; returns the manifest dict.

    `task_bytes` (default: `tasks.default_task_bytes`) sets the task size and so the output; `workers` (processes
    on this machine), `num_nodes` / `node_rank` (this machine's share of the tasks) do not. With several machines
    only the last to finish writes the manifest; the others return None. Idempotent and resumable: complete tasks
    of an interrupted run are kept; a finished preparation with the same configuration is returned without work.
    """
    tok = load_tokenizer(tokenizer, vocab_size=vocab_size)
    _check_args(seq_len, shard_size, eval_fraction, workers, num_nodes, node_rank)
    files = expand_inputs(inputs)
    sizes = [_stat(f).st_size for f in files]
    task_bytes = int(task_bytes or default_task_bytes(sum(sizes)))
    config = dict(
        format=FORMAT,
        tokenizer=tok.describe(),
        seq_len=int(seq_len),
        shard_size=int(shard_size),
        text_key=text_key,
        eval_fraction=float(eval_fraction),
        task_bytes=task_bytes,
        inputs=[[f, size, _stat(f).st_mtime_ns] for f, size in zip(files, sizes)],
    )
    fp = _fingerprint(config)
    created = not os.path.exists(output_dir)
    if not created and os.path.isdir(output_dir):
        _check_output_dir(output_dir, config, fp)  # a refusal writes nothing, not even the lock file
    _make_dir(output_dir)
    had_lock = os.path.exists(os.path.join(output_dir, LOCK))
    try:
        with _locked(output_dir):
            manifest = _check_output_dir(output_dir, config, fp)
            if manifest is not None:
                return manifest
            fresh = not os.path.exists(os.path.join(output_dir, CONFIG))
            if fresh:
                write_json(os.path.join(output_dir, CONFIG), dict(config_fingerprint=fp, config=config))
    except DataError:
        _remove_own(output_dir, created, had_lock)
        raise
    tasks = plan_tasks(files, sizes, task_bytes)
    step = TaskStep(
        output_dir,
        tasks,
        tokenizer,
        vocab_size,
        tok=tok,
        row_len=seq_len + 1,
        shard_rows=shard_size,
        text_key=text_key,
    )
    try:
        run_tasks(step, node_tasks(len(tasks), num_nodes, node_rank), workers=workers, progress=progress)
        with _locked(output_dir):
            return _merge(output_dir, tok, config, fp, len(tasks))
    except DataError:
        if fresh and num_nodes == 1:  # everything in the directory is this run's: nothing may block a fixed rerun
            _remove_preparation(output_dir)
            _remove_own(output_dir, created, had_lock)
        raise


def _merge(out: str, tok: Tokenizer, config: dict, fp: str, num_tasks: int) -> dict | None:
    """Write the manifest once every task is done (None while some are not); the same for any worker count."""
    path = os.path.join(out, MANIFEST)
    if os.path.exists(path):
        return read_json(path)
    summaries = []
    for index in range(num_tasks):
        marker = os.path.join(out, packing.task_name(index), packing.DONE)
        if not os.path.exists(marker):
            return None
        summaries.append(read_json(marker))
    if not sum(s["documents"] for s in summaries):
        raise DataError("the inputs contain no documents (all files empty or blank); check --input")
    shards = [
        dict(zip(("tokens", "segments"), (f"{packing.task_name(t)}/{n}" for n in packing.shard_names(i)[:2])), rows=r)
        for t, s in enumerate(summaries)
        for i, r in enumerate(s["rows"])
    ]
    manifest = _manifest(tok, config, fp, shards, summaries)
    write_json(path, manifest)
    return manifest


def _manifest(tok: Tokenizer, config: dict, fp: str, shards: list[dict], summaries: list[dict]) -> dict:
    num_rows = sum(s["rows"] for s in shards)
    num_tokens = sum(s["tokens"] for s in summaries)
    row_len = config["seq_len"] + 1
    frac = config["eval_fraction"]
    n_eval = min(max(int(round(num_rows * frac)), 1 if frac > 0 else 0), num_rows - 1)
    return dict(
        format=FORMAT,
        config_fingerprint=fp,
        config=config,
        tokenizer=tok.describe(),
        vocab_size=tok.vocab_size,
        pad_id=tok.pad_id,
        eos_id=tok.eos_id,
        bos_id=tok.bos_id,
        seq_len=config["seq_len"],
        row_len=row_len,
        token_dtype=packing.token_dtype(tok.vocab_size).name,
        num_documents=sum(s["documents"] for s in summaries),
        num_tokens=num_tokens,
        num_rows=num_rows,
        num_padding=num_rows * row_len - num_tokens,
        num_tasks=len(summaries),
        shards=shards,
        splits=dict(train=[0, num_rows - n_eval], eval=[num_rows - n_eval, num_rows]),
    )


# ----------------------------------------------------------------------------- reading back
def load_manifest(prepared_dir: str) -> dict:
    """The manifest of a finished preparation; `DataError` if there is none."""
    path = os.path.join(os.path.expanduser(prepared_dir), MANIFEST)
    if not os.path.exists(path):
        raise DataError(
            f"{prepared_dir} has no {MANIFEST}: it is not a finished preparation; run "
            "launch/prepare_data.py --input ... --output that_dir"
        )
    manifest = read_json(path)
    if manifest.get("format") not in READABLE_FORMATS:
        raise DataError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}; prepare it again")
    return manifest


def open_shard(prepared_dir: str, manifest: dict, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped (tokens, segments) arrays of shard `index`, each [rows, row_len]."""
    shard = manifest["shards"][index]
    pair = tuple(np.load(os.path.join(prepared_dir, shard[k]), mmap_mode="r") for k in ("tokens", "segments"))
    if pair[0].shape != (shard["rows"], manifest["row_len"]) or pair[1].shape != pair[0].shape:
        raise DataError(
            f"shard {shard['tokens']} in {prepared_dir} has shape {pair[0].shape}, manifest says "
            f"{(shard['rows'], manifest['row_len'])}; prepare the data again"
        )
    return pair


def open_shards(prepared_dir: str, manifest: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """Memory-mapped (tokens, segments) arrays, each [rows, row_len], one pair per shard."""
    return [open_shard(prepared_dir, manifest, i) for i in range(len(manifest["shards"]))]
