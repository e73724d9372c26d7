"""Training health a user can read: the progress-bar legend and fields, expert-balance warnings, and the
end-of-run expert-load heat map (docs/balancing.md).

All host-side: works on the plain-Python metric rows that `MetricWriter.write` returns / `metrics.jsonl` holds
(`load_cv` [L], `dropped_fraction` [L], `load` [L, E+1] with the skip slot last).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import ml_collections
import numpy as np

from zaya_jax.config import DROPLESS_DISPATCHES

LEGEND = (
    "progress: loss = training cross-entropy (nats/token) | tok/s = tokens per second | "
    "worst CV = highest per-layer expert-load coefficient of variation (0 = perfectly even; "
    "≤ 0.3 is balanced) @ its layer"
)


def progress_fields(row: dict[str, Any], tokens_per_s: float) -> dict[str, str]:
    """tqdm postfix: loss, tokens/s and the worst layer's load CV (with the layer index)."""
    fields = {"loss": f"{row['loss']:.3f}", "tok/s": f"{tokens_per_s:,.0f}"}
    if row.get("load_cv"):
        cv = np.asarray(row["load_cv"])
        fields["worst CV"] = f"{cv.max():.2f}@L{int(cv.argmax())}"
    return fields


FALLING = 0.5  # a value that at least halved over the last `patience` logged steps is converging: no warning


class BalanceMonitor:
    """Warns when a layer's load CV stays above `cv` or its dropped fraction above `dropped` for `patience`
    consecutive logged steps without falling to half its value at the start of that window (early in training
    the CV starts at 2–3 and the controller brings it down over ~100 steps: that is not a fault). One warning per
    layer and kind per streak; a recovered layer re-arms.

    cfg: `config.balancing` (warn_cv, warn_dropped, warn_patience; warn_patience 0 = off); model: `config.model`
    (its dispatch and capacity factor go into the advice).
    """

    def __init__(self, cfg: ml_collections.ConfigDict, model: ml_collections.ConfigDict):
        self.cv, self.dropped, self.patience = float(cfg.warn_cv), float(cfg.warn_dropped), int(cfg.warn_patience)
        self.enabled = bool(cfg.enabled)
        self.dispatch, self.capacity_factor = model.dispatch, model.capacity_factor
        self._streak: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (step, value) above the limit

    def _advice(self, kind: str) -> str:
        if kind == "cv":
            if not self.enabled:
                return "balancing is off (balancing.enabled=False): turn it on"
            return (
                "the bias controller is not keeping up: raise balancing.ki_max (faster bias moves; "
                "lower it instead if the loads oscillate between experts) or balancing.integral_clip "
                "(a router that prefers one expert strongly needs a larger bias range)"
            )
        return (
            f"raise model.capacity_factor (now {self.capacity_factor}) or use a dispatch that drops nothing "
            f"(model.dispatch=dropless; now {self.dispatch}; dropless: {', '.join(DROPLESS_DISPATCHES)}); "
            "dropped tokens skip the MoE block"
        )

    def update(self, step: int, row: dict[str, Any]) -> list[str]:
        """Feed one logged row; returns the warnings (strings) that fire at this step."""
        if self.patience <= 0 or "load_cv" not in row:
            return []
        out = []
        checks = [("cv", row["load_cv"], self.cv), ("dropped", row.get("dropped_fraction", ()), self.dropped)]
        for kind, values, limit in checks:
            for layer, v in enumerate(values):
                streak = self._streak.setdefault((kind, layer), [])
                if v <= limit:
                    streak.clear()
                    continue
                streak.append((step, float(v)))
                if len(streak) != self.patience:
                    continue
                if v <= FALLING * streak[0][1]:
                    streak.pop(0)  # still converging: slide the window instead of warning
                    continue
                what = "expert-load CV" if kind == "cv" else "dropped fraction"
                out.append(
                    f"layer {layer}: {what} {v:.3g} > {limit:g} for {self.patience} logged steps "
                    f"(steps {streak[0][0]}–{step}): {self._advice(kind)}"
                )
        return out


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` that carry per-layer loads, in step order (the last row of a step wins)."""
    rows: dict[int, dict] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if "load" in row:
                    rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


def load_matrix(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(steps [T], loads relative to the even share [L, E, T]): f_e / mean_e f_e over the real experts."""
    steps = np.array([r["step"] for r in rows])
    load = np.asarray([r["load"] for r in rows], np.float64)[:, :, :-1]  # [T, L, E]
    mean = load.mean(-1, keepdims=True)
    rel = np.divide(load, mean, out=np.zeros_like(load), where=mean > 0)
    return steps, rel.transpose(1, 2, 0)


def _edges(steps: np.ndarray) -> np.ndarray:
    """[T+1] cell edges around the logged steps [T] (midpoints; half a gap beyond each end)."""
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mid = (steps[1:] + steps[:-1]) / 2.0
    return np.concatenate([[2 * steps[0] - mid[0]], mid, [2 * steps[-1] - mid[-1]]])


def plot_load_heatmap(metrics_path: str, out_path: str, title: str = "") -> str | None:
    """Write a PNG heat map of expert load (layers × experts over logged steps) from `metrics.jsonl`.

    Colour = load / even share (1 = balanced, 0 = idle, ≥ 2 = twice its share); rows grouped by layer.
    Returns `out_path`, or None when the file has no load rows.
    """
    rows = read_rows(metrics_path)
    if not rows:
        return None
    import matplotlib  # ~1 s to import: only the end-of-run heat map needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, rel = load_matrix(rows)
    layers, experts, _ = rel.shape
    fig, ax = plt.subplots(figsize=(10, min(2.0 + 0.12 * layers * experts, 40.0)))
    edges = _edges(steps)
    im = ax.pcolormesh(
        edges,
        np.arange(layers * experts + 1),
        rel.reshape(layers * experts, -1),
        cmap="RdBu_r",
        vmin=0.0,
        vmax=2.0,
        shading="flat",
    )
    for k in range(1, layers):
        ax.axhline(k * experts, color="black", linewidth=0.8)
    ax.set_yticks((np.arange(layers) + 0.5) * experts, [f"layer {k}" for k in range(layers)])
    ax.invert_yaxis()
    ax.set_xlabel("step")
    ax.set_title(title or f"expert load / even share ({experts} experts per layer, expert 0 on top)")
    fig.colorbar(im, ax=ax, label="load / even share (1 = balanced)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
