"""An HF-layout export warns about the skip slot only when the run used it, and says how much
(zaya_jax/hf/skip_usage.py, launch.reshard --to_hf)."""

from __future__ import annotations

import json

from zaya_jax.hf.skip_usage import logged_skip_use, skip_slot_warning


def _metrics(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "skip_fr')  # a torn last line
    return str(path)


def test_an_unused_skip_slot_gives_no_warning(tmp_path):
    path = _metrics(tmp_path, [{"step": 10, "loss": 2.0, "skip_fraction": [0.0, 0.0]}, {"step": 20, "eval_loss": 1.9}])
    use = logged_skip_use(path)
    assert use == {"step": 10, "max": 0.0, "mean": 0.0}
    assert skip_slot_warning("scaled_input", use) is None


def test_a_used_skip_slot_is_reported_with_its_share_at_the_exported_step(tmp_path):
    rows = [
        {"step": 10, "skip_fraction": [0.03, 0.01]},
        {"step": 20, "skip_fraction": [0.0, 0.0]},  # after the exported step: not what step 10 learnt
    ]
    use = logged_skip_use(_metrics(tmp_path, rows), step=10)
    assert use["step"] == 10 and abs(use["max"] - 0.03) < 1e-12 and abs(use["mean"] - 0.02) < 1e-12
    message = skip_slot_warning("scaled_input", use)
    assert "up to 3.00% of a layer's tokens (mean 2.00% over layers, logged at step 10)" in message
    assert "\n" not in message


def test_without_the_run_metrics_the_warning_says_it_cannot_tell(tmp_path):
    assert logged_skip_use(str(tmp_path / "missing.jsonl")) is None
    assert "is unknown" in skip_slot_warning("scaled_input", None)
    assert skip_slot_warning("zero", None) is None  # HF-native semantics: identical outputs
