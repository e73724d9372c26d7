"""Microbenchmarks on the 8-device CPU mesh: collective correctness, bandwidth conventions, and
smoke runs of the collectives / GEMM / memory-bandwidth suites. No timing assertions."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tools import REPO
from zaya_jax.bench import collectives, common, gemm, membw

NAMES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "ppermute")


def test_eight_cpu_devices():
    assert jax.device_count() == 8
    assert collectives.default_device_counts() == [2, 4, 8]
    assert set(collectives.COLLECTIVES) == set(NAMES)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", NAMES)
def test_collective_matches_numpy(name, n):
    case = collectives.make_case(name, n, 1024, jnp.float32)
    assert case is not None and case.size_bytes == 1024
    collectives.check_case(case)  # raises AssertionError on any wrong device block


@pytest.mark.parametrize("name", NAMES)
def test_collective_bf16_and_odd_device_count(name):
    collectives.check_case(collectives.make_case(name, 3, 768, jnp.bfloat16))


def test_check_case_detects_wrong_result():
    case = collectives.make_case("all_reduce", 4, 256, jnp.float32)
    case.fn = jax.jit(lambda x: x)  # not an all-reduce
    with pytest.raises(AssertionError, match="all_reduce n=4"):
        collectives.check_case(case)


def test_reference_semantics_by_hand():
    x = np.arange(8, dtype=np.float64).reshape(2, 4)  # rank 0: 0..3, rank 1: 4..7
    c = collectives.COLLECTIVES
    np.testing.assert_array_equal(c["all_reduce"].reference(x), [[4, 6, 8, 10]] * 2)
    np.testing.assert_array_equal(c["reduce_scatter"].reference(x), [[4, 6], [8, 10]])
    np.testing.assert_array_equal(c["all_to_all"].reference(x), [[0, 1, 4, 5], [2, 3, 6, 7]])
    np.testing.assert_array_equal(c["ppermute"].reference(x), [[4, 5, 6, 7], [0, 1, 2, 3]])
    np.testing.assert_array_equal(c["broadcast"].reference(x), [[0, 1, 2, 3]] * 2)


def test_busbw_factors_hand_computed():
    expected = {
        ("all_reduce", 2): 1.0,
        ("all_reduce", 4): 1.5,
        ("all_reduce", 8): 1.75,
        ("reduce_scatter", 2): 0.5,
        ("reduce_scatter", 8): 0.875,
        ("all_gather", 4): 0.75,
        ("all_gather", 8): 0.875,
        ("all_to_all", 8): 0.875,
        ("broadcast", 8): 1.0,
        ("ppermute", 8): 1.0,
    }
    for (name, n), factor in expected.items():
        assert collectives.busbw_factor(name, n) == pytest.approx(factor), (name, n)
    algbw, busbw = collectives.bandwidths("all_reduce", 1_000_000_000, 8, 0.5)
    assert algbw == pytest.approx(2e9) and busbw == pytest.approx(3.5e9)
    # message size S conventions: all-gather S = gathered output, reduce-scatter S = per-rank input
    ag = collectives.make_case("all_gather", 8, 4096, jnp.float32)
    rs = collectives.make_case("reduce_scatter", 8, 4096, jnp.float32)
    assert ag.per_rank_in * 4 == 512 and ag.size_bytes == 4096
    assert rs.per_rank_in * 4 == 4096 and rs.size_bytes == 4096
    with pytest.raises(ValueError, match="unknown collective"):
        collectives.busbw_factor("allreduce", 2)


def test_benchmark_rows_positive():
    rows = collectives.benchmark(["all_reduce", "broadcast"], [2, 8], 256, 512, warmup=1, trials=2)
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        assert r["median_s"] > 0 and r["busbw_GBps"] > 0 and r["correct"] == "ok"
    assert all(r["emulated"] for r in rows if r["collective"] == "broadcast")


def test_quick_collectives_cli(tmp_path):
    out = tmp_path / "coll"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.bench", "--suite=collectives", f"--out={out}", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "busbw = algbw x factor" in proc.stdout and "EMULATED" in proc.stdout
    rows = common.read_csv(str(out / "collectives.csv"))
    seen = {(r["collective"], int(r["n_devices"])) for r in rows}
    assert seen == {(c, n) for c in NAMES for n in (2, 4, 8)}
    assert all(r["correct"] == "ok" and float(r["busbw_GBps"]) > 0 for r in rows)
    assert (out / "collectives.png").stat().st_size > 10_000
    md = (out / "collectives.md").read_text()  # the machine and the exact command next to the CSV / PNG
    assert "8 emulated CPU devices on" in md and "python -m launch.bench --suite=collectives" in md
    assert "cpu_model" in md and "![collectives.png](collectives.png)" in md


def test_gemm_tiny_run(tmp_path):
    rows = gemm.run(
        str(tmp_path),
        dtype=jnp.float32,
        square=(32, 64),
        tokens=16,
        unaligned_bases=(32,),
        grouped=(64, 32, 64, 4),
        max_gflop=0.5,
        warmup=1,
        trials=2,
    )
    done = [r for r in rows if not r["skipped"]]
    assert {r["sweep"] for r in done} == {"square", "model", "unaligned", "grouped"}
    assert all(r["tflops"] > 0 and r["min_s"] <= r["median_s"] for r in done)
    assert any(r["name"].startswith("head") and r["skipped"] for r in rows)  # 16x262272x2048 > 0.5 GFLOP
    assert {r["name"] for r in rows if r["sweep"] == "grouped"} == {"ragged_dot", "padded_einsum"}
    for f in ("gemm.csv", "gemm.png", "gemm_square.png", "gemm.md"):
        assert (tmp_path / f).stat().st_size > 0
    assert gemm.measure_gemm_peak(jnp.float32, size=128, warmup=1, trials=2) > 0


def test_zaya_gemm_shapes_match_spec():
    shapes = {name: (m, n, k) for name, m, n, k in gemm.zaya_shapes(tokens=4096, tokens_per_expert=512)}
    assert shapes["q"] == (4096, 1024, 2048) and shapes["k"] == (4096, 256, 2048)
    assert shapes["v"] == (4096, 128, 2048) and shapes["o"] == (4096, 2048, 1024)
    assert shapes["router"] == (4096, 256, 2048) and shapes["head"] == (4096, 262272, 2048)
    assert shapes["expert_gate_up"] == (512, 4096, 2048) and shapes["expert_down"] == (512, 2048, 2048)
    assert gemm.gemm_flops(2, 3, 4) == 48


def test_membw_tiny_run(tmp_path):
    rows = membw.run(str(tmp_path), min_bytes=4096, max_bytes=32768, warmup=1, trials=2)
    assert {r["kernel"] for r in rows} == {"copy", "scale", "triad"} and len(rows) == 3 * 4
    for r in rows:
        assert r["GBps"] > 0
        assert r["bytes_moved"] == (3 if r["kernel"] == "triad" else 2) * r["array_bytes"]
    assert (tmp_path / "membw.csv").exists() and (tmp_path / "membw.png").stat().st_size > 0
    md = (tmp_path / "membw.md").read_text()
    assert "cpu_model" in md and "Command:" in md and "![membw.png](membw.png)" in md


def test_common_helpers(tmp_path):
    assert common.pow2_sizes(1000, 8192) == [1024, 2048, 4096, 8192]
    assert common.format_bytes(1536) == "1.5 KiB" and common.format_bytes(1 << 20) == "1 MiB"
    t = common.time_fn(jax.jit(lambda x: x + 1), jnp.ones(4), warmup=1, trials=3)
    assert len(t.times) == 3 and 0 < t.min <= t.median
    info = common.machine_info()
    assert info["device_count"] == 8 and info["backend"] == "cpu" and info["cpu_cores"] >= 1
    common.write_csv(str(tmp_path / "x.csv"), [{"a": 1}, {"a": 2, "b": 3}])
    assert common.read_csv(str(tmp_path / "x.csv"))[1] == {"a": "2", "b": "3"}


# ------------------------------------------------------------------ moe / compile / checkpoint suites


def _finite_positive(x) -> bool:
    return np.isfinite(float(x)) and float(x) > 0


def _tiny_config():
    from zaya_jax.config import default_config

    return default_config()


def test_moe_suite_quick(tmp_path):
    from zaya_jax.bench import moe
    from zaya_jax.bench.inputs import quick_model

    m = _tiny_config().model
    m.update(quick_model())
    rows = moe.run(
        str(tmp_path),
        m,
        64,
        dispatches=("capacity", "dropless:loops", "ep"),
        warmup=1,
        trials=1,
        ep_devices=2,
        command="pytest",
    )
    assert [r["dispatch"] for r in rows] == ["capacity", "dropless:loops", "ep"]
    for r in rows:
        assert _finite_positive(r["ratio_vs_dense"])
        assert r["ratio_vs_dense"] == pytest.approx(r["moe_s_median"] / r["dense_s_median"])
    assert rows[1]["dropped_fraction"] == 0.0 and rows[2]["devices"] == 2
    assert list(common.read_csv(str(tmp_path / "moe.csv"))[0]) == list(moe.COLUMNS)
    report = (tmp_path / "moe.md").read_text()
    assert "pytest" in report
    # the summary names the dispatch `auto` runs on one CPU device, with its row's ratio
    assert (
        f"dropless (dropless:loops, what `auto` runs on one device here) / dense: {rows[1]['ratio_vs_dense']:.2f}x"
        in report
    )
    router, expert = moe.active_flops_per_token(m)
    assert moe.dense_width(m) * 6 * m.hidden_size == pytest.approx(router + expert, rel=0.05)


def test_compile_suite_quick(tmp_path):
    from zaya_jax.bench import compile as compile_bench

    config = _tiny_config()
    rows = compile_bench.run(
        str(tmp_path), config, depths=(4, 2), devices=jax.devices()[:1], batch=2, seq=16, warmup=False, command="pytest"
    )
    assert [r["layers"] for r in rows] == [2, 4]  # smallest depth first
    for r in rows:
        assert _finite_positive(r["compile_s"]) and r["hlo_instructions"] > 0
        assert r["total_s"] == pytest.approx(r["lower_s"] + r["compile_s"])
        assert r["ratio_vs_smallest"] == pytest.approx(r["total_s"] / rows[0]["total_s"])
        # the step the config selects, at the planner's small width, on the devices given
        assert (r["param_sharding"], r["hidden"], r["devices"]) == (config.train.param_sharding, 128, 1)
    assert rows[1]["hlo_instructions"] < 1.5 * rows[0]["hlo_instructions"]  # scanned layers: no growth with depth
    assert list(common.read_csv(str(tmp_path / "compile.csv"))[0]) == list(compile_bench.COLUMNS)


def test_checkpoint_suite_quick(tmp_path):
    from zaya_jax.bench import ckpt
    from zaya_jax.bench.inputs import quick_model

    config = _tiny_config()
    config.model.update(quick_model())
    config.model.num_layers = 1
    rows = ckpt.run(
        str(tmp_path / "out"), config, directory=str(tmp_path), trials=1, optimizer="adamw", command="pytest"
    )
    assert [r["kind"] for r in rows] == ["raw_fsync", "raw_no_fsync", "checkpoint"]
    for r in rows:
        assert _finite_positive(r["MiB_per_s"]) and _finite_positive(r["ratio_vs_raw"])
        assert r["ratio_vs_raw"] == pytest.approx(r["MiB_per_s"] / rows[0]["MiB_per_s"])
        assert r["MiB_per_s"] == pytest.approx(r["bytes"] / 2**20 / r["s_median"])
    assert list(common.read_csv(str(tmp_path / "out" / "checkpoint.csv"))[0]) == list(ckpt.COLUMNS)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("zaya_ckpt_bench_")]  # cleaned up


def test_profile_hook_writes_trace(tmp_path):
    from zaya_jax.train.profiling import ProfileHook

    hook = ProfileHook(str(tmp_path / "prof"), start=1, stop=2)
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    for step in range(1, 4):
        x = f(x) / 32
        hook(step, x, {})
    assert hook.done and not hook.active
    assert any(name.endswith(".xplane.pb") for _, _, files in os.walk(tmp_path / "prof") for name in files)
    with pytest.raises(ValueError, match="start"):
        ProfileHook(str(tmp_path), start=0, stop=1)
