"""Expert-balancing report from finished training runs (their `metrics.jsonl`): per-layer load CV and dropped
fraction over steps, last-N-step averages, the eval loss, comparison plots and expert-load heat maps.

`launch/balance_report.py` is the command line; `benchmarks/balancing/` holds committed reports.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from zaya_jax.bench import common
from zaya_jax.train import health


def eval_loss(metrics_path: str) -> float:
    """The last `eval_loss` in a `metrics.jsonl` (NaN if none)."""
    out = float("nan")
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and "eval_loss" in (row := json.loads(line)):
                out = float(row["eval_loss"])
    return out


def layer_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long-format CSV rows: one per (logged step, layer) with load_cv, dropped, skip_fraction, max_load_share."""
    out = []
    for r in rows:
        for layer, cv in enumerate(r["load_cv"]):
            load = np.asarray(r["load"][layer][:-1], np.float64)
            share = load.max() / load.mean() if load.mean() > 0 else 0.0
            out.append(
                {
                    "step": r["step"],
                    "layer": layer,
                    "load_cv": cv,
                    "dropped": r.get("dropped_fraction", [0.0] * len(r["load_cv"]))[layer],
                    "skip_fraction": r.get("skip_fraction", [0.0] * len(r["load_cv"]))[layer],
                    "max_load_share": float(share),
                }
            )
    return out


def tail_summary(rows: list[dict[str, Any]], last: int) -> dict[str, Any]:
    """Per-layer means of load_cv and dropped over the logged steps in (final step − last, final step], and the
    balance verdict: `zaya_jax.train.health.window_balance`, the definition the trainer's bar and summary use."""
    return health.window_balance(rows, last)


def report(runs: Mapping[str, str], out_dir: str, *, last: int = 50, title: str = "") -> dict[str, Any]:
    """Write `<out>/<label>.csv`, `<out>/<label>_expert_load.png`, `<out>/load_cv.png`, `<out>/dropped.png`,
    `<out>/summary.json` for runs {label: workdir}; returns the summary {label: tail_summary + eval_loss}."""
    summary, series = {}, {}
    for label, workdir in runs.items():
        path = os.path.join(workdir, "metrics.jsonl")
        rows = health.read_rows(path)
        if not rows:
            raise ValueError(f"{path} has no per-layer load rows: is {workdir} a training workdir?")
        long = layer_rows(rows)
        common.write_csv(os.path.join(out_dir, f"{label}.csv"), long)
        health.plot_load_heatmap(
            path, os.path.join(out_dir, f"{label}_expert_load.png"), title=f"{label}: expert load / even share"
        )
        summary[label] = {**tail_summary(rows, last), "eval_loss": eval_loss(path)}
        series[label] = long
    layers = max(r["layer"] for rows in series.values() for r in rows) + 1
    for metric, ylabel in (("load_cv", "expert-load CV"), ("dropped", "dropped fraction")):
        panels = {
            f"layer {k}": {
                label: ([r["step"] for r in rows if r["layer"] == k], [r[metric] for r in rows if r["layer"] == k])
                for label, rows in series.items()
            }
            for k in range(layers)
        }
        common.plot_panels(
            os.path.join(out_dir, f"{metric}.png"),
            panels,
            xlabel="step",
            ylabel=ylabel,
            title=title or ylabel,
            logx=False,
            xfmt=None,
            ncols=4,
        )
    common.write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary
