"""Offline preparation: tokenize documents, pack them into fixed-length rows, write `.npy` shards.

Layout of a prepared directory (all rows have `row_len = seq_len + 1` tokens: inputs + the label
shifted by one):

    prepare.json                        the preparation config (written first)
    shard-00000.tokens.npy              [rows, row_len] uint16/uint32 token ids
    shard-00000.segments.npy            [rows, row_len] uint16/uint32 document index within the row
                                        (1-based; 0 = padding, only at the end of the last row)
    shard-00000.json                    sidecar: the shard is complete + where the stream resumes
    manifest.json                       written last: counts, shard list, train/eval split

Documents are concatenated (each followed by eos) and cut into rows; a document may continue in
the next row. Every shard except the last holds exactly `shard_size` rows. A rerun with the same
configuration skips complete shards; a directory holding anything else is never overwritten. A preparation
that fails on bad input before completing any shard removes what it wrote, so a rerun with the input fixed
starts clean. Input files are found and read by `zaya_jax.data.inputs` (which warns about files that are
mostly not text).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from typing import Iterable, Sequence

import numpy as np

from zaya_jax.data.inputs import expand_inputs, iter_documents
from zaya_jax.data.tokenizer import DataError, Tokenizer, load_tokenizer

FORMAT = "zaya_jax.packed.v1"
MANIFEST, CONFIG, LOCK = "manifest.json", "prepare.json", ".prepare.lock"


# ----------------------------------------------------------------------------- small helpers
def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as e:
        raise DataError(f"cannot read input {path}: {e.strerror or e}; check the path and permissions") from e


def _fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _write_atomic(path: str, write) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: str, obj) -> None:
    _write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1, sort_keys=True).encode()))


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def shard_names(index: int) -> tuple[str, str, str]:
    stem = f"shard-{index:05d}"
    return f"{stem}.tokens.npy", f"{stem}.segments.npy", f"{stem}.json"


@contextlib.contextmanager
def _locked(output_dir: str):
    with open(os.path.join(output_dir, LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


# ----------------------------------------------------------------------------- packing
class _Packer:
    """Fills a flat shard buffer of `shard_rows * row_len` tokens and writes full shards."""

    def __init__(self, out: str, tok: Tokenizer, row_len: int, shard_rows: int, first_shard: int):
        self.out, self.tok, self.row_len, self.shard_rows = out, tok, row_len, shard_rows
        self.cap = row_len * shard_rows
        self.buf = np.zeros(self.cap, _token_dtype(tok.vocab_size))
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
        """Write the last, padded, partial shard, or mark the last full shard final."""
        final = dict(documents=num_documents, tokens=self.tokens)
        if self.fill:
            self._flush(dict(doc=num_documents, offset=0), final)
        else:  # the stream ended exactly on a shard boundary
            side = os.path.join(self.out, shard_names(self.shard - 1)[2])
            _write_json(side, dict(_read_json(side), final=final))

    def _flush(self, nxt: dict, final: dict | None) -> None:
        rows = -(-self.fill // self.row_len)
        n = rows * self.row_len
        tokens = self.buf[:n].copy()
        tokens[self.fill :] = self.tok.pad_id
        ords = np.repeat(np.array([o for o, _ in self.runs], np.int64), [k for _, k in self.runs])
        ords = np.concatenate([ords, np.full(n - self.fill, -1, np.int64)]).reshape(rows, self.row_len)
        segs = np.where(ords >= 0, ords - ords[:, :1] + 1, 0).astype(self.seg_dtype)
        tok_name, seg_name, side_name = (os.path.join(self.out, x) for x in shard_names(self.shard))
        _write_atomic(tok_name, lambda f: np.save(f, tokens.reshape(rows, self.row_len)))
        _write_atomic(seg_name, lambda f: np.save(f, segs))
        _write_json(side_name, dict(rows=rows, next=nxt, final=final))
        self.shard, self.fill, self.runs = self.shard + 1, 0, []


def _completed(out: str) -> list[dict]:
    """Sidecars of the consecutive complete shards 0..k-1 already on disk."""
    done = []
    while True:
        tok_name, seg_name, side_name = (os.path.join(out, x) for x in shard_names(len(done)))
        if not all(os.path.exists(p) for p in (tok_name, seg_name, side_name)):
            return done
        done.append(_read_json(side_name))
        if done[-1]["final"]:
            return done


def _check_output_dir(out: str, config: dict, fp: str) -> dict | None:
    """The finished manifest if `out` already holds this preparation; raise if it holds anything else."""
    for name in (MANIFEST, CONFIG):
        path = os.path.join(out, name)
        if os.path.exists(path):
            old = _read_json(path)
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
    others = [e for e in os.listdir(out) if e != LOCK and not e.endswith(".tmp")]
    if others:
        raise DataError(
            f"output dir {out} is not empty and holds no zaya_jax preparation "
            f"(found {others[:3]}); choose an empty or new directory"
        )
    return None


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
) -> dict:
    """Tokenize and pack `inputs` into `output_dir`; returns the manifest dict.

    Idempotent and resumable: complete shards of an interrupted run are kept; a finished
    preparation with the same configuration is returned without any work.
    """
    tok = load_tokenizer(tokenizer, vocab_size=vocab_size)
    if seq_len < 1 or shard_size < 1 or not 0.0 <= eval_fraction < 1.0:
        raise DataError(
            f"need seq_len >= 1, shard_size >= 1 and 0 <= eval_fraction < 1; got "
            f"{seq_len}, {shard_size}, {eval_fraction}"
        )
    files = expand_inputs(inputs)
    stats = [_stat(f) for f in files]
    config = dict(
        format=FORMAT,
        tokenizer=tok.describe(),
        seq_len=int(seq_len),
        shard_size=int(shard_size),
        text_key=text_key,
        eval_fraction=float(eval_fraction),
        inputs=[[f, s.st_size, s.st_mtime_ns] for f, s in zip(files, stats)],
    )
    fp = _fingerprint(config)
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DataError(f"output {output_dir} exists and is not a directory; choose a directory path")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create output directory {output_dir}: {e.strerror}") from e
    with _locked(output_dir):
        manifest = _check_output_dir(output_dir, config, fp)
        if manifest is not None:
            return manifest
        _write_json(os.path.join(output_dir, CONFIG), dict(config_fingerprint=fp, config=config))
        done = _completed(output_dir)
        if not (done and done[-1]["final"]):
            try:
                _pack(
                    iter_documents(files, text_key),
                    output_dir,
                    tok,
                    seq_len + 1,
                    shard_size,
                    done,
                    sum(s.st_size for s in stats),
                    progress,
                )
            except DataError:
                if not done:  # everything in the directory is this run's: nothing may block a fixed rerun
                    for name in os.listdir(output_dir):
                        if name == CONFIG or name.startswith("shard-"):
                            os.remove(os.path.join(output_dir, name))
                raise
            done = _completed(output_dir)
        manifest = _manifest(output_dir, tok, config, fp, done)
        _write_json(os.path.join(output_dir, MANIFEST), manifest)
        return manifest


ENCODE_BATCH = 64  # documents per `Tokenizer.encode_batch` call (tokenizers encodes a batch in parallel)


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


def _pack(
    docs: Iterable[tuple[str, str]],
    out: str,
    tok: Tokenizer,
    row_len: int,
    shard_rows: int,
    done: list[dict],
    total_bytes: int,
    progress: bool,
) -> int:
    """Pack documents into shards after the `done` ones; returns the number of documents seen."""
    from tqdm import tqdm

    resume = done[-1]["next"] if done else dict(doc=0, offset=0)
    packer = _Packer(out, tok, row_len, shard_rows, first_shard=len(done))
    eos = np.array([tok.eos_id], np.int32)
    ordinal, last_path = -1, None
    bar = tqdm(
        total=total_bytes, unit="B", unit_scale=True, desc=f"prepare {os.path.basename(out)}", disable=not progress
    )
    for batch in _batched(enumerate(docs), ENCODE_BATCH):
        todo = [(ordinal, text) for ordinal, (_, text) in batch if ordinal >= resume["doc"]]
        encoded = dict(zip((o for o, _ in todo), tok.encode_batch([t for _, t in todo]) if todo else []))
        for ordinal, (path, _) in batch:
            if path != last_path:
                if last_path is not None:
                    bar.update(os.path.getsize(last_path))
                last_path = path
                bar.set_postfix(docs=ordinal, shards=packer.shard, refresh=False)
            if ordinal not in encoded:
                continue
            ids = encoded.pop(ordinal)
            if ids.size and (int(ids.max()) >= tok.vocab_size or int(ids.min()) < 0):
                bad = int(ids.max()) if int(ids.max()) >= tok.vocab_size else int(ids.min())
                raise DataError(
                    f"token id {bad} in {path} is outside [0, vocab_size={tok.vocab_size}); use a "
                    "larger vocab_size or the tokenizer the vocab was built for"
                )
            start = resume["offset"] if ordinal == resume["doc"] else 0
            packer.add(ordinal, np.concatenate([ids, eos]), start)
    if last_path is not None:
        bar.update(os.path.getsize(last_path))
    bar.close()
    num_documents = ordinal + 1
    if num_documents == 0:
        raise DataError("the inputs contain no documents (all files empty or blank); check --input")
    packer.finish(num_documents)
    return num_documents


def _manifest(out: str, tok: Tokenizer, config: dict, fp: str, done: list[dict]) -> dict:
    final = done[-1]["final"]
    shards = [dict(zip(("tokens", "segments"), shard_names(i)[:2]), rows=s["rows"]) for i, s in enumerate(done)]
    num_rows = sum(s["rows"] for s in shards)
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
        token_dtype=_token_dtype(tok.vocab_size).name,
        num_documents=final["documents"],
        num_tokens=final["tokens"],
        num_rows=num_rows,
        num_padding=num_rows * row_len - final["tokens"],
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
    manifest = _read_json(path)
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}; prepare it again")
    return manifest


def open_shards(prepared_dir: str, manifest: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """Memory-mapped (tokens, segments) arrays, each [rows, row_len], one pair per shard."""
    out = []
    for shard in manifest["shards"]:
        pair = tuple(np.load(os.path.join(prepared_dir, shard[k]), mmap_mode="r") for k in ("tokens", "segments"))
        if pair[0].shape != (shard["rows"], manifest["row_len"]) or pair[1].shape != pair[0].shape:
            raise DataError(
                f"shard {shard['tokens']} in {prepared_dir} has shape {pair[0].shape}, manifest says "
                f"{(shard['rows'], manifest['row_len'])}; prepare the data again"
            )
        out.append(pair)
    return out
