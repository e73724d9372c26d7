"""Grain input pipeline over prepared shards, driven by a global sequence counter.

The training stream is one infinite, deterministic `grain.MapDataset` of packed rows: each source
is shuffled by seed and repeated (reshuffled every epoch), sources are mixed by weight. A
`BatchIterator` hands out global batches of any size: starting at global row k, process p of P
takes rows [k + p*B/P, k + (p+1)*B/P). Its state is just k (plus a config fingerprint), so it
survives batch-size ramps and changes of the process count.

`grain.experimental.ElasticIterator` keeps the same kind of state (a global next index) but is not used: it
fixes the global batch size when it is built (the batch ramp changes it from step to step, which would mean a
new iterator per ramp stage), and process p reads the strided rows k + p, k + p + P, ... where this pipeline
gives each process a contiguous block, so adopting it would change the data order of existing runs and the
1-process = 2-process equality the tests check, without adding anything the global counter lacks.

Batch dict (B = per-process batch, S = seq_len):
    input_ids   int32   [B, S]  row[:-1]
    labels      int32   [B, S]  row[1:]
    loss_mask   float32 [B, S]  0 where the label is padding or belongs to another document
    segment_ids int32   [B, S]  document index of each input token within its row (0 = padding)
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
from typing import Sequence

import grain
import numpy as np

from zaya_jax.data import prepare as prep
from zaya_jax.data.tokenizer import DataError

STATE_VERSION = 1
OPEN_SHARDS = 4096  # memory-mapped shards kept open per source (two maps each)


class PackedSource:
    """Random access to the rows of one split of a prepared directory (memory-mapped shards).

    `source[i]` -> {"tokens": int32 [row_len], "segment_ids": int32 [row_len]}.
    """

    def __init__(self, prepared_dir: str, split: str = "train"):
        self.dir = os.path.abspath(os.path.expanduser(prepared_dir))
        self.manifest = prep.load_manifest(self.dir)
        if split not in self.manifest["splits"]:
            raise DataError(f"split {split!r} not in {self.dir}; choose one of {list(self.manifest['splits'])}")
        self.split = split
        self._start, self._stop = self.manifest["splits"][split]
        if self._stop <= self._start:
            raise DataError(f"{self.dir} has no rows in split {split!r}; prepare more data or a non-zero eval_fraction")
        self._offsets = np.cumsum([0] + [s["rows"] for s in self.manifest["shards"]])
        self._arrays: collections.OrderedDict = collections.OrderedDict()  # shard index -> memmaps, LRU order

    @property
    def fingerprint(self) -> str:
        return f"{self.manifest['config_fingerprint']}:{self.split}"

    def _shard(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard `index`'s memmaps, opened on first use (a host opens only the shards its rows are in); at most
        OPEN_SHARDS stay mapped (a 14T-token preparation has ~10^6 shards, beyond the kernel's map count)."""
        if index in self._arrays:
            self._arrays.move_to_end(index)
        else:
            self._arrays[index] = prep.open_shard(self.dir, self.manifest, index)
            if len(self._arrays) > OPEN_SHARDS:
                self._arrays.popitem(last=False)
        return self._arrays[index]

    def __getstate__(self) -> dict:  # the source pickles without its memmaps
        return dict(self.__dict__, _arrays=collections.OrderedDict())

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {self!r}")
        row = self._start + int(index)
        shard = int(np.searchsorted(self._offsets, row, side="right")) - 1
        tokens, segments = self._shard(shard)
        r = row - int(self._offsets[shard])
        return dict(tokens=np.asarray(tokens[r], np.int32), segment_ids=np.asarray(segments[r], np.int32))

    def __repr__(self) -> str:
        return (
            f"PackedSource(name={os.path.basename(self.dir)!r}, split={self.split!r}, "
            f"rows={len(self)}, fingerprint={self.manifest['config_fingerprint']!r})"
        )


def _seed(seed: int, index: int) -> int:
    """A per-source shuffle seed in [0, 2**32)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:4], "little")


def open_sources(dirs: Sequence[str], split: str = "train") -> list[PackedSource]:
    """Open `dirs` and check they can be mixed (same row length and tokenizer)."""
    if not dirs:
        raise DataError(
            "no data sources given; pass prepared directories or leave data.sources empty for the default corpus"
        )
    sources = [PackedSource(d, split) for d in dirs]
    first = sources[0].manifest
    for s in sources[1:]:
        if s.manifest["row_len"] != first["row_len"]:
            raise DataError(
                f"{s.dir} has seq_len {s.manifest['seq_len']} but {sources[0].dir} has "
                f"{first['seq_len']}; prepare all sources with the same --seq_len"
            )
        if s.manifest["tokenizer"] != first["tokenizer"]:
            raise DataError(
                f"{s.dir} and {sources[0].dir} use different tokenizers; prepare all sources with the same --tokenizer"
            )
    return sources


def _normalise(weights: Sequence[float] | None, n: int) -> list[float]:
    weights = [1.0] * n if not weights else [float(w) for w in weights]
    if len(weights) != n or min(weights) < 0 or sum(weights) <= 0:
        raise DataError(f"weights {weights} must be {n} non-negative numbers with a positive sum")
    return [w / sum(weights) for w in weights]


def build_train_dataset(
    sources: Sequence[PackedSource], weights: Sequence[float] | None = None, *, seed: int = 0, shuffle: bool = True
) -> tuple[grain.MapDataset, str]:
    """Infinite mixed stream of rows and its fingerprint (sources, weights, seed)."""
    norm = _normalise(weights, len(sources))
    parts, kept = [], []
    for i, (src, w) in enumerate(zip(sources, norm)):
        if w == 0:
            continue  # grain's mix rejects zero proportions
        ds = grain.MapDataset.source(src)
        if shuffle:
            ds = ds.shuffle(seed=_seed(seed, i))
        parts.append(ds.repeat(None))
        kept.append(w)
    ds = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, kept)
    fp = _fingerprint(["train", [s.fingerprint for s in sources], [round(w, 9) for w in norm], seed, shuffle])
    return ds, fp


def build_eval_dataset(sources: Sequence[PackedSource]) -> tuple[grain.MapDataset, str]:
    """The held-out rows of all sources, concatenated in order (no shuffle), repeated."""
    parts = [grain.MapDataset.source(s) for s in sources]
    ds = parts[0] if len(parts) == 1 else grain.MapDataset.concatenate(parts)
    return ds.repeat(None), _fingerprint(["eval", [s.fingerprint for s in sources]])


def _fingerprint(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def rows_to_batch(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack packed rows ({"tokens", "segment_ids"} each [S+1]) into a training batch of [B, S] arrays."""
    tokens = np.stack([r["tokens"] for r in rows]).astype(np.int32)
    segs = np.stack([r["segment_ids"] for r in rows]).astype(np.int32)
    seg_in, seg_lab = segs[:, :-1], segs[:, 1:]
    return dict(
        input_ids=tokens[:, :-1],
        labels=tokens[:, 1:],
        loss_mask=((seg_lab != 0) & (seg_lab == seg_in)).astype(np.float32),
        segment_ids=seg_in,
    )


class BatchIterator:
    """Global-counter batch iterator over an infinite `MapDataset` of rows (see module docstring)."""

    def __init__(
        self,
        dataset: grain.MapDataset,
        fingerprint: str,
        *,
        process_index: int = 0,
        process_count: int = 1,
        prefetch: bool = False,
    ):
        if not 0 <= process_index < process_count:
            raise DataError(f"process_index {process_index} must be in [0, process_count={process_count})")
        self.dataset, self.fingerprint = dataset, fingerprint
        self.process_index, self.process_count = process_index, process_count
        self.global_index = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "zaya-data") if prefetch else None
        self._pending: tuple[int, int, concurrent.futures.Future] | None = None

    def _slice(self, start: int, global_batch_size: int) -> dict[str, np.ndarray]:
        per = global_batch_size // self.process_count
        lo = start + self.process_index * per
        return rows_to_batch([self.dataset[i] for i in range(lo, lo + per)])

    def next_batch(self, global_batch_size: int) -> dict[str, np.ndarray]:
        """This process's slice [global_batch_size / process_count, seq_len] of the next global batch."""
        if global_batch_size < 1 or global_batch_size % self.process_count:
            raise DataError(
                f"global batch size {global_batch_size} must be a positive multiple of the "
                f"process count {self.process_count}"
            )
        k = self.global_index
        batch = self._take_pending(k, global_batch_size)
        if batch is None:
            batch = self._slice(k, global_batch_size)
        self.global_index = k + global_batch_size
        if self._pool is not None:  # guess the next call uses the same batch size
            fut = self._pool.submit(self._slice, self.global_index, global_batch_size)
            self._pending = (self.global_index, global_batch_size, fut)
        return batch

    def _take_pending(self, k: int, global_batch_size: int) -> dict[str, np.ndarray] | None:
        if self._pending is None:
            return None
        pk, pb, fut = self._pending
        self._pending = None
        result = fut.result()  # also waits for a stale prefetch so reads never overlap
        return result if (pk, pb) == (k, global_batch_size) else None

    def get_state(self) -> dict:
        """JSON-serialisable state; identical on every process."""
        return dict(version=STATE_VERSION, global_index=int(self.global_index), fingerprint=self.fingerprint)

    def set_state(self, state: dict) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise DataError(
                f"data iterator state is for pipeline {state.get('fingerprint')!r}, this one is "
                f"{self.fingerprint!r} (different sources, weights or seed); restore with the "
                "original data config"
            )
        self._take_pending(-1, -1)
        self.global_index = int(state["global_index"])

    def reset(self) -> None:
        """Back to the first row (eval iterators call this before every evaluation)."""
        self._take_pending(-1, -1)
        self.global_index = 0

    def close(self) -> None:
        self._take_pending(-1, -1)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax

        return jax.process_index(), jax.process_count()
    return process_index, process_count


def make_train_iterator(
    dirs: Sequence[str],
    weights: Sequence[float] | None = None,
    *,
    seed: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
    prefetch: bool = False,
) -> BatchIterator:
    """Shuffled, mixed, infinite training iterator over the train splits of `dirs`."""
    ds, fp = build_train_dataset(open_sources(dirs, "train"), weights, seed=seed)
    p, n = _process(process_index, process_count)
    return BatchIterator(ds, fp, process_index=p, process_count=n, prefetch=prefetch)


def make_eval_iterator(
    dirs: Sequence[str], *, process_index: int | None = None, process_count: int | None = None
) -> BatchIterator:
    """Fixed-order iterator over the eval splits of `dirs` (wraps around); call `reset()` per eval."""
    ds, fp = build_eval_dataset(open_sources(dirs, "eval"))
    p, n = _process(process_index, process_count)
    return BatchIterator(ds, fp, process_index=p, process_count=n)


def resolve_sources(config) -> list[str]:
    """`config.data.sources`, or the default corpus (prepared into `data.cache_dir` on first use)."""
    from zaya_jax.data import corpus

    d = config.data
    if d.sources:
        return [os.path.expanduser(s) for s in d.sources]
    out = corpus.default_corpus_dir(d.cache_dir, config.train.seq_len, d.tokenizer, d.default_corpus_max_bytes)
    corpus.prepare_default_corpus(
        out, config.train.seq_len, d.tokenizer, d.default_corpus_max_bytes, eval_fraction=d.eval_fraction
    )
    return [out]


def make_iterators(
    config, *, process_index: int | None = None, process_count: int | None = None
) -> tuple[BatchIterator, BatchIterator | None, list[str]]:
    """(train iterator, eval iterator or None if no held-out rows, source dirs) from a full config."""
    dirs = resolve_sources(config)
    sources = open_sources(dirs, "train")
    m = sources[0].manifest
    if m["seq_len"] != config.train.seq_len:
        raise DataError(
            f"{sources[0].dir} was prepared with seq_len {m['seq_len']} but train.seq_len="
            f"{config.train.seq_len}; prepare again or change train.seq_len"
        )
    if m["vocab_size"] > config.model.vocab_size:
        raise DataError(
            f"the data vocab_size {m['vocab_size']} exceeds model.vocab_size="
            f"{config.model.vocab_size}; raise model.vocab_size"
        )
    train = make_train_iterator(
        dirs,
        config.data.weights or None,
        seed=config.data.shuffle_seed,
        process_index=process_index,
        process_count=process_count,
        prefetch=config.data.prefetch,
    )
    has_eval = all(s.manifest["splits"]["eval"][1] > s.manifest["splits"]["eval"][0] for s in sources)
    evals = make_eval_iterator(dirs, process_index=process_index, process_count=process_count) if has_eval else None
    return train, evals, dirs
