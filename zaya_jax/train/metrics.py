"""Metric sinks: a JSONL file and TensorBoard event files (tensorboardX).

Only process 0 writes. JSONL rows keep the metric names and per-layer arrays as lists. TensorBoard gets
named tags (`tensorboard_scalars`):

* `1_overview/…` — loss, eval loss, both learning rates, grad norm, tokens/s, MFU (the group sorts first, so
  TensorBoard opens on it; the Custom Scalars tab shows the same charts plus the MoE summary);
* `moe/max_load_cv`, `moe/dropped` — the worst layer's expert-load CV and the overall dropped fraction;
* `load_cv/layer_k`, `dropped/layer_k`, `skip_fraction/layer_k`, `max_min_load_ratio/layer_k`, `router_spread/layer_k`
  (how much the router's probabilities differ between tokens: the balancing gain unit) — one per layer;
* `load/layer_k/expert_e`, `load/layer_k/skip`, `bias/layer_k/…` — one per layer and router slot;
* `train/…` — any other scalar.

Events go to `<workdir>/tensorboard/<run name>`, so `tensorboard --logdir <workdir>/tensorboard` names the run.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np

OVERVIEW = "1_overview"
OVERVIEW_KEYS = ("loss", "eval_loss", "lr_muon", "lr_adamw", "grad_norm", "tokens_per_s", "mfu")
PER_LAYER = {
    "load_cv": "load_cv",
    "dropped_fraction": "dropped",
    "skip_fraction": "skip_fraction",
    "max_min_load_ratio": "max_min_load_ratio",
    "router_spread": "router_spread",
}
PER_SLOT = ("load", "bias")
LR_NAMES = {"muon": "lr_muon", "adam": "lr_adamw"}  # `schedule.learning_rate_schedules` keys → metric names


def to_python(value: Any) -> Any:
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else arr.tolist()


def learning_rates(schedules: dict[str, Any], step: int) -> dict[str, float]:
    """{"lr_muon": …, "lr_adamw": …}: the host-side schedules (`schedule.learning_rate_schedules`) at the
    optimizer step `step` (0-based: the LR the update of step `step` used)."""
    return {LR_NAMES.get(name, f"lr_{name}"): float(fn(step)) for name, fn in schedules.items()}


def overall_dropped(dropped: Any, skip: Any | None) -> float:
    """Dropped fraction of all expert-routed tokens, from per-layer fractions [L] and skip fractions [L].

    Every layer routes the same N tokens, N·(1 − skip_l) of them to experts, so the overall fraction is the
    per-layer one weighted by 1 − skip_l.
    """
    d = np.asarray(dropped, np.float64)
    w = np.ones_like(d) if skip is None else 1.0 - np.asarray(skip, np.float64)
    return float((d * w).sum() / w.sum()) if w.sum() > 0 else 0.0


def tensorboard_scalars(row: dict[str, Any]) -> dict[str, float]:
    """{TensorBoard tag: value} for one metrics row (see the module docstring for the tag scheme).

    Per-layer values are [L] lists; per-slot values are [L, E+1] lists whose last slot is the skip slot.
    """
    out: dict[str, float] = {}
    for name, value in row.items():
        if name in ("step", "time"):
            continue
        if name in PER_SLOT and np.ndim(value) == 2:
            arr = np.asarray(value, np.float64)
            for layer, slots in enumerate(arr):
                for e, v in enumerate(slots[:-1]):
                    out[f"{name}/layer_{layer}/expert_{e}"] = float(v)
                out[f"{name}/layer_{layer}/skip"] = float(slots[-1])
        elif np.ndim(value) == 1:
            prefix = PER_LAYER.get(name, name)
            out.update({f"{prefix}/layer_{k}": float(v) for k, v in enumerate(value)})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{OVERVIEW if name in OVERVIEW_KEYS else 'train'}/{name}"] = float(value)
    if "load_cv" in row:
        out["moe/max_load_cv"] = float(np.max(row["load_cv"]))
    if "dropped_fraction" in row:
        out["moe/dropped"] = overall_dropped(row["dropped_fraction"], row.get("skip_fraction"))
    return out


def custom_scalars_layout(mfu: bool = True) -> dict:
    """tensorboardX Custom Scalars layout: the overview charts, then the MoE balance summary. `mfu=False`
    leaves out the MFU chart (no peak FLOP/s known for the device: it would stay empty)."""
    keys = [k for k in OVERVIEW_KEYS if not k.startswith("lr_") and (mfu or k != "mfu")]
    overview = {k: ["Multiline", [f"{OVERVIEW}/{k}"]] for k in keys}
    overview["learning rates"] = ["Multiline", [f"{OVERVIEW}/lr_.*"]]
    moe = {
        "worst layer load CV": ["Multiline", ["moe/max_load_cv"]],
        "dropped fraction": ["Multiline", ["moe/dropped"]],
        "load CV per layer": ["Multiline", ["load_cv/layer_.*"]],
        "dropped per layer": ["Multiline", ["dropped/layer_.*"]],
    }
    return {"overview": overview, "MoE balance": moe}


def _keep_rows_up_to(path: str, step: int) -> dict[str, dict[str, Any]]:
    """Drop rows of steps > `step` from the JSONL file at `path` (rewritten atomically, only if any go);
    returns {metric name: last kept row that has it}."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept, last = [], {}
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
        if int(row.get("step", 0)) <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
            last.update({name: row for name in row if name not in ("step", "time")})
    if len(kept) != len(lines):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
    return last


class MetricWriter:
    """Appends rows to `<workdir>/metrics.jsonl` and scalars to `<workdir>/tensorboard/<run_name>`."""

    def __init__(
        self,
        workdir: str,
        *,
        run_name: str = "",
        enabled: bool | None = None,
        start_step: int = 0,
        mfu: bool = True,
    ):
        """`start_step`: the step training resumes from. Rows logged after it by an earlier attempt (steps
        that will be trained again) are dropped from the JSONL file and purged from TensorBoard, so a resumed
        run has one row per step; `self.previous` keeps the last kept row of each metric name. `mfu`: whether
        MFU can be computed (a peak is known), i.e. whether the overview shows its chart."""
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.run_name = run_name or os.path.basename(os.path.normpath(os.path.abspath(workdir))) or "run"
        self._jsonl = self._tb = None
        self.previous: dict[str, dict[str, Any]] = {}
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            path = os.path.join(workdir, "metrics.jsonl")
            self.previous = _keep_rows_up_to(path, start_step)
            self._jsonl = open(path, "a", encoding="utf-8")
            from tensorboardX import SummaryWriter  # ~1.6 s to import: only a run that writes events pays it

            self._tb = SummaryWriter(
                os.path.join(workdir, "tensorboard", self.run_name), purge_step=start_step + 1 if start_step else None
            )
            self._tb.add_custom_scalars(custom_scalars_layout(mfu))

    def last(self, name: str, step: int | None = None) -> Any:
        """Value of metric `name` in the last row that has it (written by this or an earlier attempt), or None;
        with `step`, only a row of exactly that step counts."""
        row = self.previous.get(name)
        return None if row is None or (step is not None and row["step"] != step) else row[name]

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": int(step), "time": time.time(), **{k: to_python(v) for k, v in metrics.items()}}
        if not self.enabled:
            return row
        self._jsonl.write(json.dumps(row) + "\n")
        self.previous.update({name: row for name in metrics})
        self._jsonl.flush()
        for tag, value in tensorboard_scalars(row).items():
            self._tb.add_scalar(tag, value, step)
        return row

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()


def restart_rate_clock(bar) -> None:
    """Forget the time a tqdm `bar` has measured so far (the first step's compilation) in its rate and ETA.

    Call it once the first step has returned: from then on steps/s and the ETA count stepping time only
    (tqdm's smoothed rate and its mean (n - initial) / elapsed would otherwise carry the compile for many
    steps). The elapsed time shown keeps counting from the real start."""
    if bar.disable:
        return
    n, started = bar.n, bar.start_t
    bar.reset(total=bar.total)
    bar.n = bar.last_print_n = bar.initial = n
    bar.start_t = started
