"""Memory-bandwidth microbenchmarks: STREAM-style copy / scale / triad (docs/benchmarks.md).

For arrays of N elements (array size = N·itemsize bytes, swept over powers of two):

| kernel | op            | bytes moved (reads + writes) |
|--------|---------------|------------------------------|
| copy   | b = a         | 2·N·itemsize                 |
| scale  | b = s·a       | 2·N·itemsize                 |
| triad  | c = a + s·b   | 3·N·itemsize                 |

GB/s = bytes / t (1 GB = 1e9 B), t = median (best: min) of single-device jitted calls. `s` is a
runtime argument so XLA cannot fold it. Sizes below the last-level cache (MI300X Infinity Cache
256 MB) show cache effects, larger ones the HBM ceiling. Each kernel is checked once against NumPy.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zaya_jax.bench import common


@dataclasses.dataclass(frozen=True)
class Kernel:
    """`fn(s, *arrays)`; `arrays` input arrays; `moved` = arrays read + written, in units of N."""

    name: str
    fn: Callable[..., jax.Array]
    arrays: int
    moved: int
    reference: Callable[..., np.ndarray]


KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel("copy", jax.jit(lambda s, a: jnp.copy(a)), 1, 2, lambda s, a: a),
        Kernel("scale", jax.jit(lambda s, a: s * a), 1, 2, lambda s, a: s * a),
        Kernel("triad", jax.jit(lambda s, a, b: a + s * b), 2, 3, lambda s, a, b: a + s * b),
    )
}


def benchmark(
    kernels: Sequence[str] = tuple(KERNELS),
    min_bytes: int = 1 << 20,
    max_bytes: int | None = None,
    dtype: Any = jnp.float32,
    warmup: int = 2,
    trials: int = 10,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (kernel, array size). Default max: 64 MiB on CPU, 4 GiB on accelerators."""
    if max_bytes is None:
        max_bytes = (64 << 20) if jax.default_backend() == "cpu" else (4 << 30)
    dtype = jnp.dtype(dtype)
    device = jax.local_devices()[0]
    s_host = np.asarray(1.5, dtype)
    s = jax.device_put(s_host, device)
    rows = []
    for name in kernels:
        if name not in KERNELS:
            raise ValueError(f"unknown kernel {name!r}; known: {sorted(KERNELS)}")
        kern = KERNELS[name]
        checked = False
        for size in common.pow2_sizes(min_bytes, max_bytes):
            n = max(1, size // dtype.itemsize)
            arrays = [common.randn((n,), dtype, seed, device) for seed in range(kern.arrays)]
            correct = ""
            if not checked:
                got = np.asarray(kern.fn(s, *arrays), np.float64)
                want = kern.reference(np.float64(s_host), *(np.asarray(a, np.float64) for a in arrays))
                tol = 1e-6 if dtype.itemsize >= 4 else 2e-2
                if not np.allclose(got, want, rtol=tol, atol=tol):
                    raise AssertionError(f"membw {name}: result differs from NumPy")
                checked, correct = True, "ok"
            t = common.time_fn(kern.fn, s, *arrays, warmup=warmup, trials=trials)
            moved = kern.moved * n * dtype.itemsize
            rows.append(
                dict(
                    kernel=name,
                    array_bytes=n * dtype.itemsize,
                    bytes_moved=moved,
                    dtype=dtype.name,
                    median_s=t.median,
                    min_s=t.min,
                    trials=trials,
                    GBps=moved / t.median / 1e9,
                    GBps_best=moved / t.min / 1e9,
                    correct=correct,
                )
            )
            del arrays
        if log:
            log(f"membw: {name} done")
    return rows


def plot(rows: Sequence[dict[str, Any]], path: str) -> list[str]:
    """GB/s vs array size on log-log axes, one line per kernel (median and best panels), and a latency panel
    (median time per kernel call); returns the file name written."""
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        "bandwidth (median)": {},
        "bandwidth (best: min time)": {},
        "latency (median)": {},
    }
    for r in rows:
        for panel, key, scale in (
            ("bandwidth (median)", "GBps", 1.0),
            ("bandwidth (best: min time)", "GBps_best", 1.0),
            ("latency (median)", "median_s", 1e6),
        ):
            xs, ys = panels[panel].setdefault(r["kernel"], ([], []))
            xs.append(r["array_bytes"])
            ys.append(r[key] * scale)
    common.plot_panels(
        path,
        panels,
        xlabel="array size",
        ylabel="GB/s (reads + writes)",
        ncols=3,
        logy=True,
        ylabels={"latency (median)": "time per call (µs)"},
        title=f"memory bandwidth on {common.device_description()}",
    )
    return [os.path.basename(path)]


def run(out_dir: str, *, command: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Benchmark (kwargs as `benchmark`), reported as membw.csv / membw.md / membw.png."""
    rows = benchmark(log=common.say, **kwargs)
    return common.report(
        out_dir,
        "membw",
        rows,
        title="Memory bandwidth (STREAM-style copy / scale / triad)",
        table_columns=["kernel", "array_bytes", "median_s", "GBps", "GBps_best"],
        notes=["GB/s = (bytes read + bytes written) / t; copy and scale move 2N elements, triad 3N"],
        plots=lambda d: plot(rows, os.path.join(d, "membw.png")),
        command=command,
    )
