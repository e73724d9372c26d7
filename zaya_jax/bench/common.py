"""Shared microbenchmark plumbing: timing, machine description, CSV/JSON output, plots.

Methodology (docs/benchmarks.md): run a compiled function `warmup` times (excluded:
compilation, caches, allocator warm-up), then `trials` timed calls, each ending in
`jax.block_until_ready`; report the median and the minimum wall time. Only process 0 of a
multi-process run writes files (`is_writer`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall times in seconds of the timed trials (warm-up excluded)."""

    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)


def time_fn(fn: Callable[..., Any], *args: Any, warmup: int = 2, trials: int = 5) -> Timing:
    """Time `fn(*args)` (typically a jitted function) with a device sync after every call.

    The first warm-up call also triggers compilation, which is therefore never timed.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return Timing(tuple(times))


def randn(shape: tuple[int, ...], dtype: Any, seed: int = 0, device: Any = None) -> jax.Array:
    """Standard-normal test data: NumPy RNG on CPU (threefry is slow there), jax.random elsewhere."""
    if jax.default_backend() == "cpu":
        host = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        return jax.device_put(host.astype(jnp.dtype(dtype)), device)
    return jax.device_put(jax.random.normal(jax.random.key(seed), shape, dtype), device)


def pow2_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two in [min_bytes, max_bytes] (min is rounded up to a power of two)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    size = 1 << (int(min_bytes) - 1).bit_length()
    out = []
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or float(n).is_integer() else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Describe the host and the JAX runtime (recorded next to every benchmark result)."""
    devices = jax.devices()
    jaxlib_version = getattr(jaxlib, "__version__", "unknown")
    return {
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib_version,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "none",
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "process_index": jax.process_index(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def default_float_dtype() -> str:
    """bf16 on accelerators (the paper's compute dtype), f32 on CPU (bf16 GEMMs are slow there)."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def is_writer() -> bool:
    """Only process 0 writes output files."""
    return jax.process_index() == 0


def say(message: str) -> None:
    """Print on process 0 only (the suites' progress log)."""
    if is_writer():
        print(message)


def write_csv(path: str, rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str] | None = None) -> None:
    """Write dict rows as CSV (columns: `fieldnames` or the union of keys in first-seen order)."""
    if fieldnames is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        fieldnames = list(seen)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(fieldnames), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)


def _pyplot():
    import matplotlib  # ~1 s to import: only the chart-writing suites need it

    matplotlib.use("Agg")  # headless; must precede pyplot's first import in this process
    import matplotlib.pyplot as plt

    return plt


Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def _panel_grid(plt, n: int, ncols: int, panel_size: tuple[float, float]):
    """A figure of `n` panels in rows of at most `ncols` (unused cells hidden) → (figure, the n axes)."""
    ncols = max(1, min(ncols, n))
    nrows = max(1, -(-n // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def plot_panels(
    path: str,
    panels: Mapping[str, Series],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = True,
    logy: bool = False,
    ncols: int = 3,
    xfmt: Callable[[float], str] | None = format_bytes,
    ylabels: Mapping[str, str] | None = None,
) -> None:
    """One subplot per panel, one line per series: `panels[panel][series] = (xs, ys)`; `ylabels[panel]`
    overrides `ylabel` for that panel."""
    plt = _pyplot()
    names = list(panels)
    fig, axes = _panel_grid(plt, len(names), ncols, (4.8, 3.6))
    for ax, name in zip(axes, names):
        for label, (xs, ys) in panels[name].items():
            ax.plot(list(xs), list(ys), marker="o", markersize=3, label=label)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        if xfmt is not None:
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _pos: xfmt(v)))
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel((ylabels or {}).get(name, ylabel), fontsize=8)
        ax.grid(True, which="both" if logy else "major", alpha=0.3)
        if panels[name]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(
    path: str,
    panels: Mapping[str, Mapping[str, Sequence[tuple[str, float]]]],
    *,
    ylabel: str,
    title: str = "",
    ncols: int = 2,
) -> None:
    """Grouped bar charts: `panels[panel][series] = [(category, value), ...]`."""
    plt = _pyplot()
    names = list(panels)
    fig, axes = _panel_grid(plt, len(names), ncols, (6.0, 3.8))
    for ax, name in zip(axes, names):
        series = panels[name]
        cats: list[str] = []
        for values in series.values():
            cats.extend(c for c, _ in values if c not in cats)
        width = 0.8 / max(1, len(series))
        for i, (label, values) in enumerate(series.items()):
            lookup = dict(values)
            xs = [j + i * width for j in range(len(cats))]
            ax.bar(xs, [lookup.get(c, 0.0) for c in cats], width=width, label=label)
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(cats))])
        ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """Plain fixed-width table on stdout (process 0 only)."""
    rows = list(rows)
    if not is_writer() or not rows:
        return

    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(fmt(r.get(c, "")).rjust(w) for c, w in zip(columns, widths)))


def command_line(argv: Sequence[str] | None = None) -> str:
    """The exact command that produced a result (`python -m launch.bench ...` for the bench launcher)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(os.path.join("launch", "bench.py")):
        argv = ["python", "-m", "launch.bench", *argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub Markdown table of `rows` restricted to `columns` (floats with 4 significant digits)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_markdown(
    path: str,
    title: str,
    sections: Sequence[tuple[str, str]],
    *,
    command: str | None = None,
    machine: Mapping[str, Any] | None = None,
) -> None:
    """Markdown report: title, the exact command, the machine description, then (heading, body) sections."""
    machine = machine if machine is not None else machine_info()
    parts = [
        f"# {title}",
        "",
        "Command:",
        "",
        "```",
        command or command_line(),
        "```",
        "",
        "Machine: " + ", ".join(f"{k}={v}" for k, v in machine.items() if k not in ("hostname",)),
        "",
    ]
    for heading, body in sections:
        parts += [f"## {heading}", "", body.rstrip(), ""]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def device_description() -> str:
    """What ran the benchmark, for titles: '8 emulated CPU devices on 2 cores', '8 x AMD Instinct MI300X'."""
    n, cores = jax.device_count(), os.cpu_count()
    if jax.default_backend() == "cpu":
        return f"{n} emulated CPU devices on {cores} cores" if n > 1 else f"1 CPU device on {cores} cores"
    procs = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
    return f"{n} x {jax.devices()[0].device_kind}{procs}"


def report(
    out_dir: str,
    suite: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    title: str,
    table_columns: Sequence[str],
    csv_columns: Sequence[str] | None = None,
    notes: Sequence[str] = (),
    sections: Sequence[tuple[str, str]] = (),
    plots: Callable[[str], Sequence[str]] | None = None,
    command: str | None = None,
    table_rows: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The one way a suite reports: print `notes` and the table (`table_rows`, default `rows`); on process 0
    write `<suite>.csv` (every row; all columns or `csv_columns`), the figures (`plots(out_dir)` returns their
    file names) and `<suite>.md` — title with the devices it ran on, the exact command, the machine,
    `sections`, the results table, the notes and the figures. Returns `rows`."""
    rows = [dict(r) for r in rows]
    table_rows = rows if table_rows is None else list(table_rows)
    for note in notes:
        say(note)
    print_table(table_rows, table_columns)
    if is_writer():
        write_csv(os.path.join(out_dir, f"{suite}.csv"), rows, csv_columns)
        figures = list(plots(out_dir)) if plots is not None else []
        body = [*sections, ("Results", markdown_table(table_rows, table_columns))]
        if notes:
            body.append(("Notes", "\n".join(f"- {n}" for n in notes)))
        if figures:
            body.append(("Figures", "\n\n".join(f"![{f}]({f})" for f in figures)))
        write_markdown(os.path.join(out_dir, f"{suite}.md"), f"{title} ({device_description()})", body, command=command)
        say(f"wrote {out_dir}/" + ", ".join([f"{suite}.csv", f"{suite}.md", *figures]))
    return rows


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is not a positive finite number."""
    if not (denominator and math.isfinite(denominator) and denominator > 0):
        return float("nan")
    return float(numerator) / float(denominator)
