"""Collective microbenchmarks through `jax.shard_map` (docs/benchmarks.md).

Each collective runs on a 1-D sub-mesh (axis `'x'`) of the first n global devices
(`jax.devices()[:n]`, so multi-process runs work). Per rank the input is a 1-D buffer; the
message size S follows the rccl-tests / nccl-tests convention:

| collective      | S                                  | busbw factor | op                        |
|-----------------|------------------------------------|--------------|---------------------------|
| all_reduce      | per-rank buffer                    | 2(n-1)/n     | psum                      |
| reduce_scatter  | per-rank input = n x output        | (n-1)/n      | psum_scatter(tiled=True)  |
| all_gather      | gathered output = n x input        | (n-1)/n      | all_gather(tiled=True)    |
| broadcast       | buffer                             | 1            | EMULATED: binomial tree of ppermute |
| all_to_all      | per-rank send buffer               | (n-1)/n      | all_to_all(tiled=True)    |
| ppermute        | per-rank buffer (ring shift)       | 1            | ppermute                  |

`algbw = S / t`, `busbw = algbw * factor`, t = median (and min) wall time of one jitted call.
Correctness is checked once per (collective, n) against NumPy, on every device's output block
(only addressable blocks in multi-process runs). On the emulated CPU mesh timings mean nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax.bench import common

AXIS = "x"
CONVENTION = (
    "convention (nccl-tests/rccl-tests): algbw = S/t with S = all_reduce: per-rank buffer; "
    "reduce_scatter: per-rank input (n x output); all_gather: gathered output (n x input); "
    "broadcast: buffer; all_to_all: per-rank send buffer; ppermute: per-rank buffer. "
    "busbw = algbw x factor: all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; "
    "broadcast, ppermute 1. t = median (busbw_best: min) wall time per jitted call; "
    "1 GB/s = 1e9 B/s. broadcast is EMULATED (binomial tree of ppermute, ceil(log2 n) rounds)."
)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One benchmarked collective.

    `in_elems(S_elems, n)` gives per-rank input elements for a message of S elements;
    `out_elems(c, n)` per-rank output elements for a per-rank input of c; `size_elems(c, n)` is S
    from c; `body(x)` runs inside shard_map on the local [c] block; `reference(X[n, c])` gives
    the expected per-device outputs [n, out_elems].
    """

    name: str
    label: str
    factor: Callable[[int], float]
    in_elems: Callable[[int, int], int]
    out_elems: Callable[[int, int], int]
    size_elems: Callable[[int, int], int]
    body: Callable[[jax.Array, int], jax.Array]
    reference: Callable[[np.ndarray], np.ndarray]
    emulated: bool = False


def _broadcast_tree(x: jax.Array, n: int, root: int = 0) -> jax.Array:
    """Binomial-tree broadcast of rank `root`'s block: round r sends rank i -> i + 2^r, i < 2^r."""
    idx = (jax.lax.axis_index(AXIS) - root) % n  # rank relative to the root
    step = 1
    while step < n:
        perm = [((i + root) % n, (i + step + root) % n) for i in range(step) if i + step < n]
        received = jax.lax.ppermute(x, AXIS, perm)
        x = jnp.where((idx >= step) & (idx < 2 * step), received, x)
        step *= 2
    return x


def _ring_shift(x: jax.Array, n: int) -> jax.Array:
    return jax.lax.ppermute(x, AXIS, [(i, (i + 1) % n) for i in range(n)])


def _rs_ref(X: np.ndarray) -> np.ndarray:
    n = X.shape[0]
    return X.sum(0).reshape(n, -1)


def _a2a_ref(X: np.ndarray) -> np.ndarray:
    n, c = X.shape
    return X.reshape(n, n, c // n).transpose(1, 0, 2).reshape(n, c)


def _tile(row: np.ndarray, n: int) -> np.ndarray:
    return np.broadcast_to(row, (n, row.shape[-1]))


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            "all_reduce",
            "all-reduce (psum)",
            lambda n: 2 * (n - 1) / n,
            in_elems=lambda s, n: s,
            out_elems=lambda c, n: c,
            size_elems=lambda c, n: c,
            body=lambda x, n: jax.lax.psum(x, AXIS),
            reference=lambda X: _tile(X.sum(0), X.shape[0]),
        ),
        Collective(
            "reduce_scatter",
            "reduce-scatter (psum_scatter tiled)",
            lambda n: (n - 1) / n,
            in_elems=lambda s, n: s // n * n,
            out_elems=lambda c, n: c // n,
            size_elems=lambda c, n: c,
            body=lambda x, n: jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True),
            reference=_rs_ref,
        ),
        Collective(
            "all_gather",
            "all-gather (all_gather tiled)",
            lambda n: (n - 1) / n,
            in_elems=lambda s, n: s // n,
            out_elems=lambda c, n: c * n,
            size_elems=lambda c, n: c * n,
            body=lambda x, n: jax.lax.all_gather(x, AXIS, axis=0, tiled=True),
            reference=lambda X: _tile(X.reshape(-1), X.shape[0]),
        ),
        Collective(
            "broadcast",
            "broadcast (EMULATED: ppermute tree)",
            lambda n: 1.0,
            in_elems=lambda s, n: s,
            out_elems=lambda c, n: c,
            size_elems=lambda c, n: c,
            body=_broadcast_tree,
            reference=lambda X: _tile(X[0], X.shape[0]),
            emulated=True,
        ),
        Collective(
            "all_to_all",
            "all-to-all (all_to_all tiled)",
            lambda n: (n - 1) / n,
            in_elems=lambda s, n: s // n * n,
            out_elems=lambda c, n: c,
            size_elems=lambda c, n: c,
            body=lambda x, n: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True),
            reference=_a2a_ref,
        ),
        Collective(
            "ppermute",
            "ppermute (ring shift i->i+1)",
            lambda n: 1.0,
            in_elems=lambda s, n: s,
            out_elems=lambda c, n: c,
            size_elems=lambda c, n: c,
            body=_ring_shift,
            reference=lambda X: np.roll(X, 1, axis=0),
        ),
    )
}


def get_collective(name: str) -> Collective:
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {sorted(COLLECTIVES)}")
    return COLLECTIVES[name]


def busbw_factor(name: str, n: int) -> float:
    """Bus-bandwidth factor of `name` at n ranks (table in docs/benchmarks.md)."""
    return get_collective(name).factor(n)


def bandwidths(name: str, size_bytes: int, n: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for message size S = `size_bytes` taking `seconds`."""
    algbw = size_bytes / seconds
    return algbw, algbw * busbw_factor(name, n)


def submesh(n: int) -> jax.sharding.Mesh:
    """1-D mesh ('x',) over the first n global devices."""
    devices = jax.devices()
    if not 1 <= n <= len(devices):
        raise ValueError(f"need 1 <= n <= {len(devices)} devices, got n={n}")
    return jax.make_mesh((n,), (AXIS,), axis_types=(AxisType.Explicit,), devices=devices[:n])


@dataclasses.dataclass
class Case:
    """A compiled collective at one (n, size): `fn(x)` maps the [n*c] input to [n*out] outputs."""

    collective: Collective
    n: int
    per_rank_in: int  # elements
    dtype: Any
    fn: Callable[[jax.Array], jax.Array]
    x: jax.Array
    host_input: np.ndarray  # [n, c]

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def size_bytes(self) -> int:
        return self.collective.size_elems(self.per_rank_in, self.n) * self.itemsize


def _test_data(n: int, c: int, itemsize: int) -> np.ndarray:
    """[n, c] small integers whose sums over ranks are exact in the benchmark dtype.

    Values 0..7 differ per rank and position. Sums over n ranks are exact in f32 for any n and in
    16-bit floats up to n = 32; beyond that only rank j % n is non-zero in column j (sums stay exact).
    """
    rank = np.arange(n)[:, None]
    col = np.arange(c)[None, :]
    data = (col * 7 + rank * 3 + (col * rank) % 5) % 8
    if itemsize < 4 and n > 32:
        data = np.where(col % n == rank, data + 1, 0)
    return data


def make_case(name: str, n: int, size_bytes: int, dtype: Any = jnp.float32) -> Case | None:
    """Build the input and jitted shard_map for message size S ~ `size_bytes` (None if too small)."""
    coll = get_collective(name)
    itemsize = jnp.dtype(dtype).itemsize
    c = coll.in_elems(size_bytes // itemsize, n)
    if c < 1 or coll.out_elems(c, n) < 1:
        return None
    mesh = submesh(n)
    sharding = NamedSharding(mesh, P(AXIS))
    host = _test_data(n, c, itemsize).astype(jnp.dtype(dtype))
    x = jax.make_array_from_callback((n * c,), sharding, lambda idx: host.reshape(-1)[idx], dtype=host.dtype)
    shard_fn = jax.shard_map(lambda b: coll.body(b, n), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
    return Case(coll, n, c, dtype, jax.jit(shard_fn), x, host)


def check_case(case: Case) -> None:
    """Run once and compare every addressable device block with NumPy; AssertionError if wrong."""
    out = jax.block_until_ready(case.fn(case.x))
    expected = case.collective.reference(case.host_input.astype(np.float64))
    per_dev = case.collective.out_elems(case.per_rank_in, case.n)
    if out.shape != (case.n * per_dev,):
        raise AssertionError(
            f"{case.collective.name} n={case.n}: output shape {out.shape}, expected {(case.n * per_dev,)}"
        )
    for shard in out.addressable_shards:
        start = shard.index[0].start or 0
        rank = start // per_dev
        got = np.asarray(shard.data, dtype=np.float64)
        if not np.array_equal(got, expected[rank]):
            bad = int(np.argmax(got != expected[rank]))
            raise AssertionError(
                f"{case.collective.name} n={case.n} rank {rank}: element {bad} is "
                f"{got[bad]}, expected {expected[rank][bad]}"
            )


def benchmark(
    names: Sequence[str] = tuple(COLLECTIVES),
    device_counts: Sequence[int] | None = None,
    min_bytes: int = 1 << 10,
    max_bytes: int = 1 << 24,
    dtype: Any = jnp.float32,
    warmup: int = 2,
    trials: int = 10,
    check: bool = True,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Sweep collectives x device counts x power-of-two sizes; one CSV row per measurement."""
    if device_counts is None:
        device_counts = default_device_counts()
    rows = []
    for name in names:
        coll = get_collective(name)
        for n in device_counts:
            checked_at = None
            for size in common.pow2_sizes(min_bytes, max_bytes):
                case = make_case(name, n, size, dtype)
                if case is None:
                    continue
                if check and checked_at is None:
                    check_case(case)  # raises on a wrong result
                    checked_at = case.size_bytes
                t = common.time_fn(case.fn, case.x, warmup=warmup, trials=trials)
                s = case.size_bytes
                algbw, busbw = bandwidths(name, s, n, t.median)
                _, busbw_best = bandwidths(name, s, n, t.min)
                row = dict(
                    collective=name,
                    label=coll.label,
                    emulated=coll.emulated,
                    n_devices=n,
                    dtype=jnp.dtype(dtype).name,
                    size_bytes=s,
                    per_rank_in_bytes=case.per_rank_in * case.itemsize,
                    per_rank_out_bytes=coll.out_elems(case.per_rank_in, n) * case.itemsize,
                    median_s=t.median,
                    min_s=t.min,
                    trials=trials,
                    factor=coll.factor(n),
                    algbw_GBps=algbw / 1e9,
                    busbw_GBps=busbw / 1e9,
                    busbw_best_GBps=busbw_best / 1e9,
                    correct="ok" if checked_at is not None else "unchecked",
                    checked_at_bytes=checked_at if checked_at is not None else "",
                )
                rows.append(row)
            if log is not None:
                status = "no sizes fit" if checked_at is None else f"correct, checked at S={checked_at} B"
                log(f"{name:>14s} n={n:<4d} done ({status})")
    return rows


def default_device_counts(max_devices: int | None = None) -> list[int]:
    """2, 4, 8, ... up to the device count (plus the count itself if not a power of two)."""
    total = jax.device_count() if max_devices is None else min(max_devices, jax.device_count())
    counts, n = [], 2
    while n <= total:
        counts.append(n)
        n *= 2
    if total >= 2 and counts[-1] != total:
        counts.append(total)
    return counts


def plot(rows: Sequence[dict[str, Any]], path: str) -> list[str]:
    """Bus bandwidth vs message size on log-log axes: one panel per collective, one line per device count; and
    a latency panel (median time per call, the largest device count, one line per collective). Returns the
    file name written."""
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for r in rows:
        series = panels.setdefault(r["label"], {}).setdefault(f"n={r['n_devices']}", ([], []))
        series[0].append(r["size_bytes"])
        series[1].append(r["busbw_GBps"])
    widest = max((r["n_devices"] for r in rows), default=0)
    latency = f"latency, n={widest}"
    for r in rows:
        if r["n_devices"] == widest:
            xs, ys = panels.setdefault(latency, {}).setdefault(r["label"], ([], []))
            xs.append(r["size_bytes"])
            ys.append(r["median_s"] * 1e6)
    common.plot_panels(
        path,
        panels,
        xlabel="message size S",
        ylabel="busbw (GB/s, median)",
        logy=True,
        ylabels={latency: "time per call (µs, median)"},
        title=f"collectives on {common.device_description()}; busbw = S/t x factor (nccl-tests convention)",
    )
    return [os.path.basename(path)]


def run(
    out_dir: str,
    names: Sequence[str] = tuple(COLLECTIVES),
    device_counts: Sequence[int] | None = None,
    min_bytes: int = 1 << 10,
    max_bytes: int = 1 << 24,
    dtype: Any = jnp.float32,
    warmup: int = 2,
    trials: int = 10,
    *,
    command: str | None = None,
) -> list[dict[str, Any]]:
    """Benchmark, reported as collectives.csv / collectives.md / collectives.png (summary table: the largest
    message of each collective and device count)."""
    common.say(CONVENTION)
    rows = benchmark(names, device_counts, min_bytes, max_bytes, dtype, warmup, trials, log=common.say)
    largest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:  # the table: the largest message per (collective, n)
        key = (r["collective"], r["n_devices"])
        if key not in largest or r["size_bytes"] > largest[key]["size_bytes"]:
            largest[key] = r
    common.report(
        out_dir,
        "collectives",
        rows,
        title="Collectives: bus bandwidth",
        table_rows=largest.values(),
        table_columns=["collective", "n_devices", "size_bytes", "median_s", "algbw_GBps", "busbw_GBps", "correct"],
        sections=[
            ("Convention", CONVENTION),
            ("Table", "The largest message of each collective and device count; every size is in collectives.csv."),
        ],
        plots=lambda d: plot(rows, os.path.join(d, "collectives.png")),
        command=command,
    )
    return rows
