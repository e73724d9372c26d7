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

BALANCE_WINDOW = 50  # steps: balance is judged on the mean over the logged steps of the last 50 steps
BALANCED_CV = 0.3  # a layer is balanced when its mean expert-load CV over that window is at most this …
BALANCED_DROPPED = 0.01  # … and its mean dropped fraction at most this (docs/balancing.md "Reading a run")

LEGEND = (
    "progress: loss = training cross-entropy (nats/token) | tok/s = tokens per second | "
    f"worst CV = highest per-layer expert-load coefficient of variation, mean over the last {BALANCE_WINDOW} "
    f"steps (0 = perfectly even; ≤ {BALANCED_CV:g} with ≤ {BALANCED_DROPPED:.0%} dropped is balanced) @ its layer | "
    "dropped = the highest per-layer share of tokens over expert capacity, same window (shown when > 0)"
)


def window_balance(rows: Sequence[dict[str, Any]], last: int = BALANCE_WINDOW) -> dict[str, Any] | None:
    """Per-layer balance over the logged rows of the last `last` steps: the one definition the progress bar, the
    run summary and `launch.balance_report` share.

    rows: metric rows in step order carrying `load_cv` [L] (and `dropped_fraction` [L]); the window is the rows
    with step in (final step − last, final step]. Returns None without such rows, else {final_step,
    window_steps, logged_steps_in_window, load_cv [L], dropped [L] (means), max_load_cv, max_dropped,
    worst_layer (argmax of load_cv), balanced (every layer's CV ≤ BALANCED_CV and dropped ≤ BALANCED_DROPPED)}.
    """
    rows = [r for r in rows if r.get("load_cv")]
    if not rows:
        return None
    final = rows[-1]["step"]
    tail = [r for r in rows if r["step"] > final - last]
    cv = np.mean([r["load_cv"] for r in tail], axis=0)
    dropped = np.mean([r.get("dropped_fraction") or np.zeros_like(cv) for r in tail], axis=0)
    return {
        "final_step": int(final),
        "window_steps": int(last),
        "logged_steps_in_window": len(tail),
        "load_cv": [round(float(v), 4) for v in cv],
        "dropped": [round(float(v), 5) for v in dropped],
        "max_load_cv": round(float(cv.max()), 4),
        "max_dropped": round(float(dropped.max()), 5),
        "worst_layer": int(cv.argmax()),
        "balanced": bool(cv.max() <= BALANCED_CV and dropped.max() <= BALANCED_DROPPED),
    }


def unbalanced_layers(balance: dict[str, Any]) -> list[str]:
    """One line per layer that fails the balance rule of `window_balance`'s result (empty when balanced)."""
    out = []
    for layer, (cv, dropped) in enumerate(zip(balance["load_cv"], balance["dropped"])):
        if cv > BALANCED_CV or dropped > BALANCED_DROPPED:
            out.append(
                f"layer {layer}: mean expert-load CV {cv:.2f} (balanced: ≤ {BALANCED_CV:g}), dropped "
                f"{dropped:.2%} (≤ {BALANCED_DROPPED:.0%})"
            )
    return out


def balance_verdict(balance: dict[str, Any] | None) -> str | None:
    """The run summary's balance line from `window_balance`'s result, or None without MoE rows."""
    if balance is None:
        return None
    span = f"over the last {balance['window_steps']} steps (to step {balance['final_step']})"
    if balance["balanced"]:
        return (
            f"experts balanced {span}: worst layer {balance['worst_layer']} at mean load CV "
            f"{balance['max_load_cv']:.2f}, at most {balance['max_dropped']:.2%} of tokens dropped"
        )
    return f"experts NOT balanced {span}: " + "; ".join(unbalanced_layers(balance))


def progress_fields(row: dict[str, Any], tokens_per_s: float, balance: dict[str, Any] | None = None) -> dict[str, str]:
    """tqdm postfix: loss, tokens/s and the worst layer's mean load CV over the balance window (with the layer
    index; `balance` = `window_balance` of the rows so far, else the row's own CV) and its dropped share when
    any token was dropped."""
    fields = {"loss": f"{row['loss']:.3f}", "tok/s": f"{tokens_per_s:,.0f}"}
    if balance is None and row.get("load_cv"):
        balance = window_balance([{"step": 0, **row}])
    if balance is not None:
        fields["worst CV"] = f"{balance['max_load_cv']:.2f}@L{balance['worst_layer']}"
        if balance["max_dropped"] > 0:
            fields["dropped"] = f"{balance['max_dropped']:.2%}"  # 0.05% is not 0.0%
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
        ragged = (
            "model.dispatch=ep_ragged, whose per-device receive buffer drops fewer at the same capacity factor, or "
            if self.dispatch == "ep"
            else ""
        )
        return (
            f"raise model.capacity_factor (now {self.capacity_factor}) or use {ragged}a dispatch that drops nothing "
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
