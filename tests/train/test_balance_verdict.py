"""Expert balance as a run reports it: the progress bar, the run summary and `launch.balance_report` judge it on
the same window (the logged steps of the last 50 steps) against the same threshold (mean load CV ≤ 0.3 and
≤ 1% dropped on every layer), and a run that ends unbalanced says so (README Quickstart, docs/balancing.md)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.tools.checkpoint_helpers import data_dir, run, train_cmd  # noqa: F401 - data_dir is a fixture
from zaya_jax.bench.balancing import tail_summary
from zaya_jax.train import health


def rows_of(cvs: list[list[float]], dropped: list[list[float]] | None = None, every: int = 10) -> list[dict]:
    """Logged rows at steps every, 2·every, … with the given per-layer CVs (and dropped fractions)."""
    dropped = dropped or [[0.0] * len(cvs[0])] * len(cvs)
    return [
        {"step": every * (k + 1), "loss": 1.0, "load_cv": cv, "dropped_fraction": dropped[k]}
        for k, cv in enumerate(cvs)
    ]


def test_the_window_is_the_last_50_steps_and_the_mean_decides():
    # 10 logged steps; the first five (steps 10–50) are far off, the window (60–100) has layer 1 at a mean of 0.32
    early = [[2.0, 2.0]] * 5
    late = [[0.1, 0.2], [0.1, 0.5], [0.2, 0.2], [0.1, 0.4], [0.2, 0.3]]
    balance = health.window_balance(rows_of(early + late))
    assert balance["window_steps"] == 50 and balance["logged_steps_in_window"] == 5 and balance["final_step"] == 100
    np.testing.assert_allclose(balance["load_cv"], [0.14, 0.32])
    assert balance["worst_layer"] == 1 and balance["max_load_cv"] == pytest.approx(0.32)
    assert balance["balanced"] is False  # 0.32 > 0.3, although the last logged step alone (0.3) would pass
    verdict = health.balance_verdict(balance)
    assert verdict.startswith("experts NOT balanced over the last 50 steps (to step 100): layer 1: mean")
    assert "layer 0" not in verdict


def test_dropped_tokens_unbalance_a_run_with_even_loads():
    rows = rows_of([[0.1]] * 5, dropped=[[0.0], [0.02], [0.02], [0.0], [0.02]])
    balance = health.window_balance(rows)
    assert balance["max_dropped"] == pytest.approx(0.012) and not balance["balanced"]
    assert "dropped 1.20%" in health.balance_verdict(balance)
    fine = health.window_balance(rows_of([[0.1]] * 5, dropped=[[0.0], [0.01], [0.0], [0.0], [0.0]]))
    assert fine["balanced"] and health.balance_verdict(fine).startswith("experts balanced over the last 50 steps")


def test_the_bar_and_the_report_show_the_same_window_as_the_summary(tmp_path):
    cvs = [[1.5, 0.2], [0.4, 0.2], [0.3, 0.25], [0.2, 0.35], [0.25, 0.2], [0.2, 0.2], [0.2, 0.1]]
    rows = rows_of(cvs)
    balance = health.window_balance(rows)
    # the bar: the worst layer's window mean, not the last step's CV (layer 0 at 0.2 would look fine)
    fields = health.progress_fields(rows[-1], 1000.0, balance)
    assert fields["worst CV"] == f"{max(balance['load_cv']):.2f}@L{balance['worst_layer']}" == "0.23@L0"
    # launch.balance_report's numbers come from the same function, read back from metrics.jsonl
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({**r, "load": [[0.25] * 4 + [0.0]] * 2}) + "\n" for r in rows))
    assert tail_summary(health.read_rows(str(path)), 50) == balance
    assert "last 50 steps" in health.LEGEND and "≤ 0.3" in health.LEGEND


def test_balance_report_defaults_to_the_trainers_window():
    from launch import balance_report

    assert balance_report._LAST.default == health.BALANCE_WINDOW


@pytest.mark.slow
def test_the_summary_says_when_a_run_ends_unbalanced(data_dir, tmp_path):  # noqa: F811
    """8 steps of the tiny model are far from balanced: the summary says so, with the numbers
    `launch.balance_report` computes from the same metrics.jsonl (the console's resume line: test_checkpoint)."""
    workdir = str(tmp_path / "run")
    out = run(train_cmd(workdir, data_dir, 1), 1).stdout
    summary = json.loads(out[out.index("{\n") : out.rindex("\n}") + 2])
    assert summary["balanced"] is False
    assert summary["balance"] == tail_summary(health.read_rows(os.path.join(workdir, "metrics.jsonl")), 50)
    assert health.balance_verdict(summary["balance"]) in out.splitlines()
