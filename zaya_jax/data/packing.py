"""The work of one preparation task: tokenize its documents, pack them into rows, write complete shards.

A task (`zaya_jax.data.tasks`) owns a list of input chunks and its own directory `task-NNNNNN/` of the
prepared output:

    task-000000/shard-00000.tokens.npy      [rows, row_len] uint16/uint32 token ids
    task-000000/shard-00000.segments.npy    [rows, row_len] uint16/uint32 document index within the row
                                            (1-based; 0 = padding, only at the end of the task's last row)
    task-000000/shard-00000.json            sidecar: the shard is complete + where the task's stream resumes
    task-000000/done.json                   written last: the task is complete (rows per shard, counts)

Documents are concatenated (each followed by eos) and cut into rows; a document may continue in the next row.
Every shard of a task except its last holds exactly `shard_size` rows. Files are written to temporary names and
renamed, so a half-written shard never counts (a rerun deletes it); an interrupted task resumes after its last
complete shard, and its output is the same as an uninterrupted run's. Nothing here depends on how many tasks run at
once.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Iterable, Sequence

import numpy as np

from zaya_jax.data.inputs import iter_chunk_documents
from zaya_jax.data.tokenizer import DataError, Tokenizer

ENCODE_BATCH = 64  # documents per `Tokenizer.encode_batch` call
DONE = "done.json"


# ----------------------------------------------------------------------------- files
def write_atomic(path: str, write) -> None:
    """Write through `write(file)` to a unique temporary name, fsync, rename onto `path`."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str, obj) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1, sort_keys=True).encode()))


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def task_name(index: int) -> str:
    return f"task-{index:06d}"


def shard_names(index: int) -> tuple[str, str, str]:
    stem = f"shard-{index:05d}"
    return f"{stem}.tokens.npy", f"{stem}.segments.npy", f"{stem}.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


# ----------------------------------------------------------------------------- packing
class _Packer:
    """Fills a flat shard buffer of `shard_rows * row_len` tokens and writes full shards."""

    def __init__(self, out: str, tok: Tokenizer, row_len: int, shard_rows: int, first_shard: int):
        self.out, self.tok, self.row_len, self.shard_rows = out, tok, row_len, shard_rows
        self.cap = row_len * shard_rows
        self.buf = np.zeros(self.cap, token_dtype(tok.vocab_size))
        self.seg_dtype = np.dtype(np.uint16 if row_len < 2**16 else np.uint32)
        self.fill, self.runs = 0, []  # runs: (doc ordinal, length) in buffer order
        self.shard = first_shard
        self.tokens = first_shard * self.cap

    def add(self, ordinal: int, tokens: np.ndarray, start: int = 0) -> None:
        """Append tokens[start:] of document `ordinal` (eos already appended)."""
        pos = start
        while pos < tokens.size:
            n = min(tokens.size - pos, self.cap - self.fill)
            self.buf[self.fill : self.fill + n] = tokens[pos : pos + n]
            self.runs.append((ordinal, n))
            self.fill, pos, self.tokens = self.fill + n, pos + n, self.tokens + n
            if self.fill == self.cap:
                nxt = dict(doc=ordinal, offset=pos) if pos < tokens.size else dict(doc=ordinal + 1, offset=0)
                self._flush(nxt, final=None)

    def finish(self, num_documents: int) -> None:
        """Write the last, padded, partial shard, or mark the last full shard final (nothing for an empty task)."""
        final = dict(documents=num_documents, tokens=self.tokens)
        if self.fill:
            self._flush(dict(doc=num_documents, offset=0), final)
        elif self.shard:  # the stream ended exactly on a shard boundary
            side = os.path.join(self.out, shard_names(self.shard - 1)[2])
            write_json(side, dict(read_json(side), final=final))

    def _flush(self, nxt: dict, final: dict | None) -> None:
        rows = -(-self.fill // self.row_len)
        n = rows * self.row_len
        tokens = self.buf[:n].copy()
        tokens[self.fill :] = self.tok.pad_id
        ords = np.repeat(np.array([o for o, _ in self.runs], np.int64), [k for _, k in self.runs])
        ords = np.concatenate([ords, np.full(n - self.fill, -1, np.int64)]).reshape(rows, self.row_len)
        segs = np.where(ords >= 0, ords - ords[:, :1] + 1, 0).astype(self.seg_dtype)
        tok_name, seg_name, side_name = (os.path.join(self.out, x) for x in shard_names(self.shard))
        write_atomic(tok_name, lambda f: np.save(f, tokens.reshape(rows, self.row_len)))
        write_atomic(seg_name, lambda f: np.save(f, segs))
        write_json(side_name, dict(rows=rows, next=nxt, final=final))
        self.shard, self.fill, self.runs = self.shard + 1, 0, []


def _remove_partial_writes(task_dir: str) -> None:
    """Delete the temporary files (`write_atomic`) an interrupted run of this task left behind: they never count,
    and the rerun writes its own."""
    for name in os.listdir(task_dir):
        if name.endswith(".tmp"):
            try:
                os.remove(os.path.join(task_dir, name))
            except FileNotFoundError:
                pass


def completed_shards(out: str) -> list[dict]:
    """Sidecars of the consecutive complete shards 0..k-1 already in task directory `out`."""
    done = []
    while True:
        tok_name, seg_name, side_name = (os.path.join(out, x) for x in shard_names(len(done)))
        if not all(os.path.exists(p) for p in (tok_name, seg_name, side_name)):
            return done
        done.append(read_json(side_name))
        if done[-1]["final"]:
            return done


def _batched(items: Iterable, size: int) -> Iterable[list]:
    """Lists of up to `size` consecutive items."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _check_ids(ids: np.ndarray, tok: Tokenizer, path: str) -> None:
    if ids.size and (int(ids.max()) >= tok.vocab_size or int(ids.min()) < 0):
        bad = int(ids.max()) if int(ids.max()) >= tok.vocab_size else int(ids.min())
        raise DataError(
            f"token id {bad} in {path} is outside [0, vocab_size={tok.vocab_size}); use a "
            "larger vocab_size or the tokenizer the vocab was built for"
        )


def pack_documents(
    docs: Iterable[tuple[str, str]], out: str, tok: Tokenizer, row_len: int, shard_rows: int, done: list[dict]
) -> int:
    """Pack (path, text) documents into the shards of `out` after the `done` ones; returns the documents seen."""
    resume = done[-1]["next"] if done else dict(doc=0, offset=0)
    packer = _Packer(out, tok, row_len, shard_rows, first_shard=len(done))
    eos = np.array([tok.eos_id], np.int32)
    ordinal = -1
    for batch in _batched(enumerate(docs), ENCODE_BATCH):
        todo = [(ordinal, path, text) for ordinal, (path, text) in batch if ordinal >= resume["doc"]]
        encoded = tok.encode_batch([text for _, _, text in todo]) if todo else []
        for (ordinal, path, _), ids in zip(todo, encoded):
            _check_ids(ids, tok, path)
            start = resume["offset"] if ordinal == resume["doc"] else 0
            packer.add(ordinal, np.concatenate([ids, eos]), start)
        ordinal = batch[-1][0]
    packer.finish(ordinal + 1)
    return ordinal + 1


def run_task(
    out: str,
    index: int,
    chunks: Sequence[tuple[str, int, int | None]],
    tok: Tokenizer,
    *,
    row_len: int,
    shard_rows: int,
    text_key: str,
) -> dict:
    """Prepare task `index` (its `chunks`) into `out/task-NNNNNN/`; returns its done.json (a finished task's is
    read back without any work): {"rows": [rows per shard], "documents": n, "tokens": n}."""
    task_dir = os.path.join(out, task_name(index))
    marker = os.path.join(task_dir, DONE)
    if os.path.exists(marker):
        return read_json(marker)
    os.makedirs(task_dir, exist_ok=True)
    _remove_partial_writes(task_dir)
    done = completed_shards(task_dir)
    if not (done and done[-1]["final"]):
        pack_documents(iter_chunk_documents(chunks, text_key), task_dir, tok, row_len, shard_rows, done)
        done = completed_shards(task_dir)
    final = done[-1]["final"] if done else dict(documents=0, tokens=0)
    summary = dict(rows=[s["rows"] for s in done], documents=final["documents"], tokens=final["tokens"])
    write_json(marker, summary)
    return summary
