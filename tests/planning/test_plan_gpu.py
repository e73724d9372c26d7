"""`launch.plan --target`: the GPU program's expert GEMM work in the projection (`launch.plan_gpu`)."""

import ml_collections
import pytest

from launch.plan_gpu import format_compiled_work, planned_expert_factor, with_compiled_experts


def plan_result(step_s: float = 1.0, mfu: float = 0.3) -> dict:
    row = {"step_s": step_s, "mfu": mfu, "tokens_per_s_per_device": 1000.0}
    return {"projection": {"peak_flops": 1e15, "projected": dict(row), "overlapped": dict(row, step_s=0.8, mfu=0.375)}}


def compiled(executed: float, routed: float, squares: int = 0, kernel: str = "ragged_dot") -> dict:
    return {
        "expert_flops_executed": executed,
        "expert_flops_routed": routed,
        "expert_ratio": executed / routed,
        "grouped_gemm": kernel,
        "program": {"square_buffers": ["f32[8,4096,4096]"] * squares},
    }


def test_a_dense_expert_lowering_adds_its_extra_flops_at_the_peak():
    # 16e12 executed for 1e12 routed, planned at cf 1: 15e12 extra FLOPs / 1e15 FLOP/s = 15 ms more per step;
    # MFU 0.3 x 1/1.015 = 29.6%, overlapped 0.375 x 0.8/0.815 = 36.8%
    r = plan_result()
    r["gpu_compiled"] = compiled(16e12, 1e12, squares=2)
    r["gpu_projection"] = g = with_compiled_experts(r, r["gpu_compiled"], 1.0)
    assert g["extra_expert_s"] == pytest.approx(0.015)
    assert g["projected"]["step_s"] == pytest.approx(1.015)
    assert g["projected"]["mfu"] == pytest.approx(0.3 / 1.015)
    assert g["overlapped"]["step_s"] == pytest.approx(0.815)
    assert g["overlapped"]["tokens_per_s_per_device"] == pytest.approx(1000.0 * 0.8 / 0.815)
    lines = format_compiled_work(r)
    assert "executed/routed 16.00 (ragged_dot) vs 1.00 planned: +15.0 ms per step" in lines[0]
    assert "projected MFU 29.6% (overlapped 36.8%)" in lines[0]
    assert lines[1].startswith("  [.., S, S] attention buffers in the GPU program: 2")


def test_grouped_gemms_and_planned_capacity_change_nothing():
    r = plan_result()
    r["gpu_compiled"] = compiled(1.75e12, 1e12, kernel="")  # ep at cf 1.75, planned at cf 1.75
    r["gpu_projection"] = g = with_compiled_experts(r, r["gpu_compiled"], 1.75)
    assert g["extra_expert_s"] == pytest.approx(0.0, abs=1e-12) and g["projected"]["mfu"] == pytest.approx(0.3)
    assert format_compiled_work(r) == [
        "  expert GEMM FLOPs as compiled: executed/routed 1.75 (capacity buffers), as planned"
    ]


def test_planned_expert_factor():
    def cfg(dispatch, cf):
        return ml_collections.ConfigDict({"model": {"dispatch": dispatch, "capacity_factor": cf}})

    assert planned_expert_factor(cfg("ep", 1.75)) == 1.75
    assert planned_expert_factor(cfg("capacity", 2.0)) == 2.0
    assert planned_expert_factor(cfg("ep_ragged", 1.5)) == 1.5  # planned as ep at its cf
    assert planned_expert_factor(cfg("dropless", 2.0)) == 1.0
