"""Metric sinks: a JSONL file, TensorBoard event files (tensorboardX) and the console.

Only process 0 writes. Values are converted to plain Python numbers (per-layer arrays become lists
in JSONL and `name/layer_k` scalars in TensorBoard).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np


def to_python(value: Any) -> Any:
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else arr.tolist()


class MetricWriter:
    def __init__(self, workdir: str, *, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._jsonl = self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": int(step), "time": time.time(), **{k: to_python(v) for k, v in metrics.items()}}
        if not self.enabled:
            return row
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for name, value in row.items():
            if name in ("step", "time"):
                continue
            if isinstance(value, list):
                for k, v in enumerate(np.ravel(value)):
                    self._tb.add_scalar(f"{name}/layer_{k}", float(v), step)
            elif isinstance(value, (int, float)):
                self._tb.add_scalar(name, float(value), step)
        return row

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
