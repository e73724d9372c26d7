"""Does an export's skip-slot semantics change its outputs? The run's own record of skip-slot use decides.

transformers' HF-native ZAYA zeroes the skip slot's output (`model.skip_output="zero"`, docs/architecture.md
§7); a model trained with "scaled_input" computes something else for exactly the tokens its router sends to
the skip slot, and the same for every other token. Training logs the fraction of each layer's tokens routed
there (`skip_fraction`, one value per layer, in `<workdir>/metrics.jsonl`), so an export knows whether — and
for how many tokens — the outputs in transformers would differ.
"""

from __future__ import annotations

import json
import os


def logged_skip_use(metrics_path: str, step: int | None = None) -> dict | None:
    """{"step", "max", "mean"} of the per-layer skip fractions in the last row of `metrics_path` at or before
    `step` (None: any step) that has them; None when the file is missing or has no such row."""
    if not os.path.isfile(metrics_path):
        return None
    found = None
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            fractions = row.get("skip_fraction") if isinstance(row, dict) else None
            if fractions is None or (step is not None and int(row.get("step", 0)) > step):
                continue
            values = [float(v) for v in (fractions if isinstance(fractions, list) else [fractions])]
            if values:
                found = {"step": int(row.get("step", 0)), "max": max(values), "mean": sum(values) / len(values)}
    return found


def skip_slot_warning(skip_output: str, use: dict | None) -> str | None:
    """The warning an HF-layout export of a `skip_output` model should print, given its logged skip use
    (`logged_skip_use`); None when transformers computes exactly what the model does."""
    if skip_output == "zero":
        return None
    legacy = "use --hf_layout=legacy for ports with the scaled-input skip"
    if use is None:
        return (
            f"model.skip_output={skip_output!r}: transformers' HF-native ZAYA zeroes the skip slot; this run's "
            "metrics.jsonl (skip_fraction) was not found, so whether its outputs differ is unknown: they do for "
            f"every token the router sends to the skip slot ({legacy})"
        )
    if use["max"] == 0.0:
        return None
    return (
        f"model.skip_output={skip_output!r}: transformers' HF-native ZAYA zeroes the skip slot, which this model's "
        f"router used for up to {use['max']:.2%} of a layer's tokens (mean {use['mean']:.2%} over layers, logged at "
        f"step {use['step']}): transformers' outputs differ for those tokens and everything after them ({legacy})"
    )
