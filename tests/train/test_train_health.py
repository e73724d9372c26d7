"""Training health: TensorBoard tags, balance warnings, the expert-load heat map, the progress-bar fields."""

from __future__ import annotations

import glob
import io
import json
import math
import os
import struct

import numpy as np
import pytest
from tqdm import tqdm

from zaya_jax.config import default_config, load_config, validate
from zaya_jax.train import health, schedule
from zaya_jax.train.metrics import OVERVIEW, MetricWriter, custom_scalars_layout, learning_rates, restart_rate_clock


def read_scalars(event_dir: str) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the TFRecord event files in `event_dir` (framing parsed here, by hand:
    u64 length, u32 crc, payload, u32 crc; payloads are `Event` protos)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(event_dir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def example_row(layers: int = 3, experts: int = 4) -> dict:
    rng = np.random.default_rng(0)
    load = rng.dirichlet(np.ones(experts + 1), size=layers)
    return {
        "loss": 2.5,
        "grad_norm": 0.7,
        "tokens_per_s": 1234.0,
        "mfu": 0.2,
        "lr_muon": 0.02,
        "lr_adamw": 3e-3,
        "z_loss": 0.0,
        "global_batch": 8,
        "load": load,
        "bias": rng.normal(size=(layers, experts + 1)),
        "load_cv": np.array([0.1, 0.9, 0.4]),
        "dropped_fraction": np.array([0.0, 0.3, 0.1]),
        "skip_fraction": np.array([0.0, 0.5, 0.0]),
        "max_min_load_ratio": np.array([1.2, 9.0, 2.0]),
    }


def test_tensorboard_tags_per_layer_and_slot(tmp_path):
    workdir = tmp_path / "my_run"
    writer = MetricWriter(str(workdir), enabled=True)
    row = example_row()
    writer.write(10, row)
    writer.write(10, {"eval_loss": 1.9})
    writer.close()
    run_dir = workdir / "tensorboard" / "my_run"  # the run is named after the workdir, not "."
    scalars = {tag: v[10] for tag, v in read_scalars(str(run_dir)).items()}
    # per layer and per slot, the last slot being skip: no flattened [layers × slots] index
    for layer in range(3):
        for e in range(4):
            assert scalars[f"load/layer_{layer}/expert_{e}"] == pytest.approx(row["load"][layer][e])
            assert scalars[f"bias/layer_{layer}/expert_{e}"] == pytest.approx(row["bias"][layer][e])
        assert scalars[f"load/layer_{layer}/skip"] == pytest.approx(row["load"][layer][4])
        assert scalars[f"bias/layer_{layer}/skip"] == pytest.approx(row["bias"][layer][4])
        assert scalars[f"load_cv/layer_{layer}"] == pytest.approx(row["load_cv"][layer])
        assert scalars[f"dropped/layer_{layer}"] == pytest.approx(row["dropped_fraction"][layer])
    assert not any(t.startswith(("load/layer_5", "bias/layer_4")) for t in scalars)
    assert scalars["moe/max_load_cv"] == pytest.approx(0.9)
    # overall dropped = dropped tokens / expert-routed tokens; layer 1 routes half its tokens (skip 0.5)
    assert scalars["moe/dropped"] == pytest.approx((0.0 * 1 + 0.3 * 0.5 + 0.1 * 1) / 2.5)
    overview = {t.split("/", 1)[1] for t in scalars if t.startswith("1_overview/")}
    assert overview == {"loss", "eval_loss", "lr_muon", "lr_adamw", "grad_norm", "tokens_per_s", "mfu"}
    assert scalars["1_overview/lr_adamw"] == pytest.approx(3e-3)
    assert scalars["train/z_loss"] == 0.0
    # the overview group sorts before every other group, so TensorBoard opens on it
    assert sorted({t.split("/")[0] for t in scalars})[0] == "1_overview"
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["load"][1] == pytest.approx(list(row["load"][1]))  # JSONL keeps the [L, E+1] arrays


def test_learning_rates_both_optimizers():
    config = default_config()
    config.train.steps = 100
    config.optimizer.update(warmup_steps=10, learning_rate=0.02, adam_learning_rate=0.004)
    lrs = learning_rates(schedule.learning_rate_schedules(config), 10)  # end of warmup: the peaks
    assert lrs == pytest.approx({"lr_muon": 0.02, "lr_adamw": 0.004})
    assert learning_rates(schedule.learning_rate_schedules(config), 0) == {"lr_muon": 0.0, "lr_adamw": 0.0}


def test_run_name_from_config(tmp_path):
    writer = MetricWriter(str(tmp_path / "w"), run_name="ablation-3", enabled=True)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert read_scalars(str(tmp_path / "w" / "tensorboard" / "ablation-3"))["1_overview/loss"] == {1: 1.0}


def monitor(patience=3, **kw):
    config = default_config()
    config.balancing.update(warn_patience=patience, **kw)
    config.model.dispatch, config.model.capacity_factor = "ep", 2.0
    return health.BalanceMonitor(config.balancing, config.model)


def test_balance_warnings_name_layer_and_fix():
    mon = monitor(patience=3)
    ok = {"load_cv": [0.1, 0.1], "dropped_fraction": [0.0, 0.0]}
    bad_cv = {"load_cv": [0.1, 0.8], "dropped_fraction": [0.0, 0.0]}
    bad_drop = {"load_cv": [0.1, 0.1], "dropped_fraction": [0.2, 0.0]}
    assert mon.update(10, bad_cv) == [] and mon.update(20, bad_cv) == []
    (msg,) = mon.update(30, bad_cv)
    assert msg.startswith("layer 1: expert-load CV 0.8 > 0.5 for 3 logged steps (steps 10–30)")
    assert "balancing.ki_max" in msg
    assert mon.update(40, bad_cv) == []  # once per streak
    mon.update(50, ok)  # recovered: re-armed
    assert [mon.update(s, bad_cv) for s in (60, 70)] == [[], []] and len(mon.update(80, bad_cv)) == 1
    out = [mon.update(s, bad_drop) for s in (90, 100, 110)]
    assert out[:2] == [[], []] and len(out[2]) == 1
    assert out[2][0].startswith("layer 0: dropped fraction 0.2 > 0.05")
    assert "model.capacity_factor (now 2.0)" in out[2][0] and "model.dispatch=dropless" in out[2][0]
    assert "model.dispatch=ep_ragged" in out[2][0]  # under `ep`: the dispatch whose buffers drop fewer
    assert monitor(patience=0).update(10, bad_cv) == []  # 0 = off


def test_balance_warning_waits_while_the_cv_is_still_falling():
    """The start of a run: a CV that halves over every window of `patience` logged steps is the controller at
    work, not a fault (the demo goes 2.6 → 0.6 in its first 100 steps); once a window does not halve, it warns."""
    mon = monitor(patience=3)
    falling = [2.6, 1.6, 1.2, 0.78, 0.58]  # each value ≤ half the value two logs earlier, from the third on
    assert [mon.update(10 * (k + 1), {"load_cv": [v]}) for k, v in enumerate(falling)] == [[]] * 5
    (msg,) = mon.update(60, {"load_cv": [0.57]})  # window 0.78, 0.58, 0.57: not halved
    assert msg.startswith("layer 0: expert-load CV 0.57 > 0.5 for 3 logged steps (steps 40–60)")
    assert mon.update(70, {"load_cv": [0.57]}) == []  # once per streak


def test_progress_fields_show_worst_layer():
    fields = health.progress_fields({"loss": 1.23456, "load_cv": [0.2, 1.5, 0.3]}, 12345.6)
    assert fields == {"loss": "1.235", "tok/s": "12,346", "worst CV": "1.50@L1"}
    assert "worst CV" in health.LEGEND and "tok/s" in health.LEGEND


def test_heatmap_png(tmp_path):
    path = tmp_path / "metrics.jsonl"
    load = np.full((2, 5), 0.25)
    load[:, -1] = 0.0
    skewed = np.array([[0.7, 0.1, 0.1, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    rows = [{"step": 10, "load": load.tolist()}, {"step": 10, "eval_loss": 2.0}, {"step": 20, "load": skewed.tolist()}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steps, rel = health.load_matrix(health.read_rows(str(path)))
    np.testing.assert_array_equal(steps, [10, 20])
    np.testing.assert_allclose(rel[:, :, 0], 1.0)  # balanced: every expert at its share
    np.testing.assert_allclose(rel[0, :, 1], [2.8, 0.4, 0.4, 0.4])  # 0.7 of 4 experts' tokens = 2.8× share
    np.testing.assert_allclose(rel[1, :, 1], 1.0)  # skip traffic is not an expert's load
    out = health.plot_load_heatmap(str(path), str(tmp_path / "png" / "load.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty.jsonl").write_text(json.dumps({"step": 1, "eval_loss": 2.0}) + "\n")
    assert health.plot_load_heatmap(str(tmp_path / "empty.jsonl"), str(tmp_path / "y.png")) is None


def test_resumed_writer_keeps_one_row_per_step_and_the_last_loss(tmp_path):
    """A run that crashed after logging steps 1..30 but saved at 20 trains 21..30 again: the rows of the first
    attempt past step 20 go, the last loss and eval loss up to step 20 stay known (a resume that trains nothing
    reports them)."""
    first = MetricWriter(str(tmp_path), enabled=True)
    for step in range(5, 31, 5):
        first.write(step, {"loss": 10.0 - step / 10})
        if step % 10 == 0:
            first.write(step, {"eval_loss": 20.0 - step / 10})
    first.close()
    resumed = MetricWriter(str(tmp_path), enabled=True, start_step=20)
    assert resumed.last("loss") == pytest.approx(8.0) and resumed.last("eval_loss", step=20) == pytest.approx(18.0)
    assert resumed.last("eval_loss", step=25) is None
    resumed.write(25, {"loss": 7.4})
    resumed.close()
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    steps = [(r["step"], "loss" in r) for r in rows]
    assert steps == [(5, True), (10, True), (10, False), (15, True), (20, True), (20, False), (25, True)]
    assert rows[-1]["loss"] == pytest.approx(7.4)


# ---------------- a newcomer's first runs: a smoke run shorter than its warm-up trains, the ETA ignores the compile
# step, the demo draws a held-out curve, and an MFU chart is shown only where MFU can be computed.


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
