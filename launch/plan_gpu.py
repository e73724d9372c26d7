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
        "  the verdict uses the compiled peak",
    ]


def topology(n: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of `n` devices on nodes of `per_node` GPUs; ValueError when they do not fill nodes."""
    if n > per_node and n % per_node:
        raise ValueError(f"--target: {n} devices do not fill nodes of --gpus_per_node={per_node}")
    return (1, n) if n <= per_node else (n // per_node, per_node)


def gpu_compiled(cfg, result: dict, target, per_node: int) -> None:
    """Compile the planned step (with the remat the plan chose) for `target` in a child process
    (`launch.gpu_compile_job`); result["gpu_compiled"] gets its figures and result["fits"] its verdict."""
    nodes, gpus = topology(result["setup"]["devices"], per_node)
    planned = copy.deepcopy(cfg)
    with planned.unlocked():
        planned.model.remat = result["setup"]["remat"]
    compiled = run_in_child(planned, target, nodes, gpus)
    result["gpu_compiled"] = compiled
    if compiled["ok"]:
        result["memory"]["peak_gpu_compiled"] = compiled["memory"]["peak"]
        result["fits"] = compiled["memory"]["peak"] <= result["memory"]["usable"]
    else:
        result["fits"] = False
