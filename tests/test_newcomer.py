"""A newcomer's first runs: a smoke run shorter than its warm-up trains, the ETA ignores the compile step,
the demo draws a held-out curve, and an MFU chart is shown only where MFU can be computed."""

from __future__ import annotations

import io
import math

import pytest
from tqdm import tqdm

from zaya_jax.config import default_config, load_config, validate
from zaya_jax.train import schedule
from zaya_jax.train.metrics import OVERVIEW, custom_scalars_layout, restart_rate_clock


def test_a_run_shorter_than_its_warmup_warms_up_over_all_its_steps():
    config = default_config()
    config.train.steps, config.optimizer.warmup_steps = 2, 20
    validate(config)  # no longer refused
    assert schedule.warmup_note(config) == (
        "optimizer.warmup_steps=20 > train.steps=2: warming up over all 2 steps instead"
    )
    lr = schedule.learning_rate_schedules(config)["muon"]
    peak = config.optimizer.learning_rate
    assert float(lr(0)) == 0.0 and math.isclose(float(lr(1)), peak / 2, rel_tol=1e-6)
    config.train.steps = 1000
    assert schedule.warmup_note(config) is None


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _eta_s(bar) -> float:
    d = bar.format_dict
    return (d["total"] - d["n"]) / d["rate"]


@pytest.mark.parametrize("restart", [False, True])
def test_the_eta_ignores_the_compile_step(restart):
    clock = _Clock()
    bar = tqdm(total=100, file=io.StringIO(), mininterval=0, miniters=1, smoothing=0.3)
    bar._time = clock
    bar.start_t = bar.last_print_t = 0.0
    clock.now = 60.0  # the first step returns after a minute of compilation
    if restart:
        restart_rate_clock(bar)
    for _ in range(5):  # then one step per second
        clock.now += 1.0
        bar.update(1)
    eta = _eta_s(bar)
    if restart:
        assert math.isclose(eta, 95.0, rel_tol=1e-6), eta  # 95 steps left at 1 step/s
        assert bar.format_dict["elapsed"] == 65.0  # the elapsed time still counts the compile
    else:
        assert eta > 300, eta  # what the bar showed before: the compile dominates the smoothed rate
    bar.close()


def test_the_demo_evaluates_often_enough_for_a_curve():
    config = load_config("experiments/zaya1_demo.py")
    assert config.train.eval_every > 0 and config.train.steps // config.train.eval_every >= 10


def test_the_mfu_chart_is_shown_only_where_a_peak_is_known():
    assert "mfu" in custom_scalars_layout(mfu=True)["overview"]
    overview = custom_scalars_layout(mfu=False)["overview"]
    assert "mfu" not in overview and "eval_loss" in overview
    assert all(f"{OVERVIEW}/mfu" not in chart[1] for chart in overview.values())
