"""The embedded default corpus: the Python standard library's own `.py` sources (code + docstrings).

It exists on every machine with Python, so demos and smoke tests need no download. The file list
is deterministic for a given Python installation (sorted relative paths, test directories and
site-packages skipped, capped at `max_bytes`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig

import numpy as np

from zaya_jax.config import DEFAULT_CORPUS_MAX_BYTES
from zaya_jax.data import prepare as prep
from zaya_jax.data.tokenizer import DataError, Tokenizer

DEFAULT_MAX_BYTES = DEFAULT_CORPUS_MAX_BYTES
SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "lib2to3",
        "ensurepip",
        "turtledemo",
    }
)


def stdlib_dir() -> str:
    """The directory of the running interpreter's standard library."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(max_bytes: int = DEFAULT_MAX_BYTES, root: str | None = None) -> list[str]:
    """Sorted `.py` files of the standard library whose sizes sum to at most `max_bytes`."""
    root = root or stdlib_dir()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith((".", "test_"))]
        rel = os.path.relpath(dirpath, root)
        found += [
            os.path.normpath(os.path.join(rel, f)) for f in filenames if f.endswith(".py") and not f.startswith("test_")
        ]
    files, total = [], 0
    for rel in sorted(found):
        path = os.path.join(root, rel)
        size = os.path.getsize(path)
        if total + size > max_bytes:
            break
        files.append(path)
        total += size
    if not files:
        raise DataError(
            f"no standard-library .py files under {root} fit in max_bytes={max_bytes}; "
            "raise data.default_corpus_max_bytes or pass data.sources"
        )
    return files


def input_files(specs: list[str], max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
    """Input specs of the data launchers (each may be comma-separated) -> inputs; `["default"]` is the embedded
    corpus (the standard-library files, up to `max_bytes`)."""
    inputs = [part for spec in specs for part in spec.split(",") if part]
    return stdlib_files(max_bytes) if inputs == ["default"] else inputs


def default_corpus_dir(
    cache_dir: str, seq_len: int, tokenizer: "str | Tokenizer" = "byte", max_bytes: int = DEFAULT_MAX_BYTES
) -> str:
    """A cache sub-directory unique to (Python version, file list, tokenizer, seq_len, max_bytes)."""
    files = stdlib_files(max_bytes)
    key = [
        prep.FORMAT,
        sys.version,
        [(f, os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files],
        tokenizer if isinstance(tokenizer, str) else repr(tokenizer),
    ]
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:10]
    tok_name = "byte" if tokenizer == "byte" else "tok"
    name = f"stdlib-py{sys.version_info.major}{sys.version_info.minor}-{tok_name}-s{seq_len}-{digest}"
    return os.path.join(os.path.expanduser(cache_dir), name)


def prepare_default_corpus(
    out_dir: str,
    seq_len: int,
    tokenizer: "str | Tokenizer" = "byte",
    max_bytes: int = DEFAULT_MAX_BYTES,
    eval_fraction: float = 0.02,
    shard_size: int = 2048,
    progress: bool = True,
) -> dict:
    """Prepare the standard-library corpus into `out_dir` (reused if already prepared); returns the manifest."""
    return prep.prepare(
        stdlib_files(max_bytes),
        out_dir,
        seq_len=seq_len,
        tokenizer=tokenizer,
        shard_size=shard_size,
        eval_fraction=eval_fraction,
        progress=progress,
    )


def token_counts(manifest_dir: str, split: str = "train") -> np.ndarray:
    """Occurrences of each token id over the non-padding tokens of `split`, int64 [vocab_size]."""
    manifest = prep.load_manifest(manifest_dir)
    start, stop = manifest["splits"][split]
    counts = np.zeros(manifest["vocab_size"], np.int64)
    row0 = 0
    for tokens, segments in prep.open_shards(manifest_dir, manifest):
        lo, hi = max(start - row0, 0), min(stop - row0, tokens.shape[0])
        for a in range(lo, hi, 1024):  # chunks keep memory small on large shards
            b = min(a + 1024, hi)
            t = np.asarray(tokens[a:b])[np.asarray(segments[a:b]) != 0]
            counts += np.bincount(t.astype(np.int64), minlength=counts.size)[: counts.size]
        row0 += tokens.shape[0]
    return counts


def unigram_entropy(manifest_dir: str, split: str = "train") -> float:
    """Entropy (nats/token) of the unigram distribution of the prepared `split` tokens.

    A model that has learnt only token frequencies reaches this cross-entropy; a lower loss means
    it uses context.
    """
    counts = token_counts(manifest_dir, split).astype(np.float64)
    if counts.sum() == 0:
        raise DataError(f"{manifest_dir} has no tokens in split {split!r}")
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
