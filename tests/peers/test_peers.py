"""The peer comparisons of benchmarks/peers/ (not part of the installed package; `python -m benchmarks.peers`): against
transformers (each side in its own process, pooled rounds) and the MaxText row's matched model. No timing
assertions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.peers import maxtext, suite, train
from tests.tools import REPO
from zaya_jax.bench import common
from zaya_jax.config import default_config
from zaya_jax.model.flops import train_flops_per_token


def test_quick_train_cli_without_reference_runs_only_our_side(tmp_path):
    """`--reference=false` with separate runs: one fresh process per round for our side, none for transformers."""
    out = tmp_path / "train"
    cmd = ["--quick", "--reference=false", "--separate_runs=1", "--dtype=float32", f"--out={out}"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", *cmd], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out / "runs")) == ["0_zaya_jax"]
    assert "round 0 zaya_jax" in proc.stdout and "transformers (float32)" not in proc.stdout
    impls = [r["impl"] for r in common.read_csv(str(out / "train.csv"))]
    assert "zaya_jax" in impls and "transformers" not in impls


def test_entry_point_without_out_is_one_line_exit_78():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "--quick"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 78, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == ["peers: error: --out is required, e.g. --out=benchmarks/train"], lines


def test_train_suite_quick(tmp_path):
    config = train.bench_config(default_config(), quick=True, batch=2, seq=32)
    rows = suite.report(str(tmp_path), config, steps=1, warmup=1, gemm_size=64, command="pytest")
    got = {r["impl"]: r for r in rows}
    csv_rows = common.read_csv(str(tmp_path / "train.csv"))
    assert list(csv_rows[0]) == list(train.COLUMNS)
    md = (tmp_path / "train.md").read_text()
    assert "pytest" in md and "cpu_model" in md and "ratio_vs_transformers" in md
    ours = got["zaya_jax"]
    assert ours["tokens_per_s"] == pytest.approx(ours["tokens_per_step"] / ours["step_s_median"])
    assert suite.is_finite_positive(ours["mfu"]) and suite.is_finite_positive(ours["gemm_peak_gflops"])
    assert ours["dropped_fraction"] == 0.0  # the default dispatch is dropless
    if "transformers" in got and "tokens_per_s" in got["transformers"]:
        ref = got["transformers"]
        assert suite.is_finite_positive(ours["ratio_vs_transformers"])
        assert ours["ratio_vs_transformers"] == pytest.approx(ours["tokens_per_s"] / ref["tokens_per_s"])
        assert abs(ours["loss_first"] - ref["loss_first"]) < 1e-4  # same weights, same batch
        assert float(csv_rows[[r["impl"] for r in csv_rows].index("zaya_jax")]["ratio_vs_transformers"]) > 0


def test_pool_rounds_pools_step_times_of_separate_runs():
    """Rows of separate single-side runs → one row per side: median over all steps, ratio of the pooled rates."""
    config = train.bench_config(default_config(), quick=True, batch=2, seq=32)
    tokens = 2 * 32

    def side(impl, times, losses):
        return dict(
            impl=impl,
            optimizer="adamw",
            _times=times,
            _losses=losses,
            gemm_peak_gflops=100.0,
            compile_s=1.0,
            notes="",
            dropped_fraction=0.0,
        )

    rounds = [
        [side("zaya_jax", [1.0, 3.0], [5.0, 4.0])],
        [side("transformers", [4.0, 4.0], [5.0, 4.5])],
        [side("zaya_jax", [2.0, 2.5], [5.0, 4.0])],
        [side("transformers", [5.0, 6.0], [5.0, 4.5])],
        [dict(impl="maxtext", notes="not run")],
    ]
    rows = {r["impl"]: r for r in train.pool_rounds(config, rounds)}
    assert set(rows) == {"zaya_jax", "transformers"}
    assert rows["zaya_jax"]["step_s_median"] == 2.25 and rows["transformers"]["step_s_median"] == 4.5
    assert rows["zaya_jax"]["ratio_vs_transformers"] == pytest.approx((tokens / 2.25) / (tokens / 4.5))
    assert rows["zaya_jax"]["max_abs_loss_diff"] == pytest.approx(0.5)
    assert rows["zaya_jax"]["steps"] == 4


def test_maxtext_matched_config_has_maxtext_active_flops():
    """The ZAYA1 we time against MaxText does the same work per token (within the CCA/router extras)."""
    s = maxtext.SETTINGS
    # Mixtral-style layer by hand: q/k/v/o projections, top-2 SwiGLU experts, router; untied head; attention
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 2 * 3 * 256 * 512 + 256 * 8
    assert maxtext.flops_per_token() == 6 * (4 * layer + 1024 * 256) + 6 * 4 * 4 * 64 * 256
    matched = maxtext.matched_config(train.bench_config(default_config()))
    ours = train_flops_per_token(matched.model, matched.train.seq_len)
    assert abs(ours / maxtext.flops_per_token() - 1) < 0.1
    assert matched.train.global_batch_size * matched.train.seq_len == (
        s["per_device_batch_size"] * s["max_target_length"]
    )
