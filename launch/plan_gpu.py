"""`launch.plan --target=...`: the planned step compiled by the GPU compiler for the planned mesh, in a child
process (`launch.gpu_compile_job`), its peak per device beside the planner's estimate (docs/planner.md,
"Compiling for a GPU without one")."""

from __future__ import annotations

import copy

from launch.gpu_compile_job import run_in_child

GB = 1e9


def format_gpu_compiled(r: dict) -> list[str]:
    """The GPU compiler's peak per device beside the planner's estimates (`--target`)."""
    g, mem = r["gpu_compiled"], r["memory"]
    head = f"GPU-compiled for {g['target']} (topology {g['topology']}"
    if not g["ok"]:
        return [f"{head}): {g['error']}", "  the verdict below cannot use a compiled peak: the compile failed"]
    m = g["memory"]
    return [
        f"{head}, lower {g['lower_s']:.1f} s + compile {g['compile_s']:.1f} s): peak {m['peak'] / GB:.2f} GB per "
        f"device (arguments {m['argument'] / GB:.2f}, temporaries {m['temp'] / GB:.2f}) vs estimate "
        f"{mem['peak_without_cpu_copies'] / GB:.2f} GB on a bf16 accelerator (XLA:CPU {mem['peak'] / GB:.2f} GB)",
        f"  {g['line']}",
        *format_compiled_work(r),
        "  the verdict uses the compiled peak",
    ]


def topology(n: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of `n` devices on nodes of `per_node` GPUs; ValueError when they do not fill nodes."""
    if n > per_node and n % per_node:
        raise ValueError(f"--target: {n} devices do not fill nodes of --gpus_per_node={per_node}")
    return (1, n) if n <= per_node else (n // per_node, per_node)


def gpu_compiled(cfg, result: dict, target, per_node: int, runs: tuple[str, float] | None = None) -> None:
    """Compile the planned step (with the remat the plan chose) for `target` in a child process
    (`launch.gpu_compile_job`); result["gpu_compiled"] gets its figures, result["fits"] its verdict and
    result["gpu_projection"] the projection with the expert GEMM work the GPU program executes.

    runs: the (dispatch, capacity factor) the trainer runs where the plan used a stand-in (the planner plans a
    dropless step as per-device capacity buffers at cf 1; XLA:CPU lowers `ragged_dot` densely): the GPU compiles
    what will train."""
    nodes, gpus = topology(result["setup"]["devices"], per_node)
    planned = copy.deepcopy(cfg)
    with planned.unlocked():
        planned.model.remat = result["setup"]["remat"]
        if runs is not None:
            planned.model.dispatch, planned.model.capacity_factor = runs[0], float(runs[1])
    compiled = run_in_child(planned, target, nodes, gpus)
    result["gpu_compiled"] = compiled
    if compiled["ok"]:
        result["memory"]["peak_gpu_compiled"] = compiled["memory"]["peak"]
        result["fits"] = compiled["memory"]["peak"] <= result["memory"]["usable"]
        result["gpu_projection"] = with_compiled_experts(result, compiled, planned_expert_factor(cfg))
    else:
        result["fits"] = False


def planned_expert_factor(cfg) -> float:
    """Expert GEMM FLOPs the plan executed per routed token's: the capacity factor of a planned `ep` / `capacity`
    dispatch (buffers of cf × tokens / E rows per expert) or `ep_ragged` (which `plan` plans as `ep` at its cf),
    else 1."""
    return float(cfg.model.capacity_factor) if cfg.model.dispatch in ("ep", "ep_ragged", "capacity") else 1.0


def with_compiled_experts(result: dict, compiled: dict, planned_factor: float) -> dict:
    """The plan's projected and overlapped step with the expert GEMM FLOPs the GPU program executes in place of
    the planned ones (a dense lowering over all E experts shows up as (E − 1)× the routed work, at the bf16 peak
    like every GEMM in the projection). The GPU program's [.., S, S] attention buffers are counted, not priced."""
    proj = result["projection"]
    extra = compiled["expert_flops_executed"] - planned_factor * compiled["expert_flops_routed"]
    extra_s = extra / proj["peak_flops"]
    out: dict = {
        "expert_ratio": compiled["expert_ratio"],
        "planned_expert_ratio": planned_factor,
        "extra_expert_s": extra_s,
        "square_buffers": len(compiled["program"]["square_buffers"]),
    }
    for key in ("projected", "overlapped"):
        p = proj[key]
        step = p["step_s"] + extra_s
        out[key] = {
            "step_s": step,
            "mfu": p["mfu"] * p["step_s"] / step,
            "tokens_per_s_per_device": p["tokens_per_s_per_device"] * p["step_s"] / step,
        }
    return out


def format_compiled_work(r: dict) -> list[str]:
    """What the GPU program's expert GEMMs and attention change in the projection (`with_compiled_experts`)."""
    g = r.get("gpu_projection")
    if not g:
        return []
    kernel = r["gpu_compiled"].get("grouped_gemm") or "capacity buffers"
    head = f"  expert GEMM FLOPs as compiled: executed/routed {g['expert_ratio']:.2f} ({kernel})"
    if abs(g["expert_ratio"] - g["planned_expert_ratio"]) <= 0.05:
        lines = [f"{head}, as planned"]
    else:
        lines = [
            f"{head} vs {g['planned_expert_ratio']:.2f} planned: {g['extra_expert_s'] * 1e3:+.1f} ms per step -> "
            f"projected MFU {g['projected']['mfu']:.1%} (overlapped {g['overlapped']['mfu']:.1%})"
        ]
    if g["square_buffers"]:
        lines.append(f"  [.., S, S] attention buffers in the GPU program: {g['square_buffers']} (not priced)")
    return lines
