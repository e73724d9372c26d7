"""The report of `launch.gpu_check --compile=...`: report.md (per target: memory, kernels, collective schedule),
report.json (every figure), and the scheduled HLO of each target beside them (`<target>.hlo.txt`).

Each result is `gpu_compile.GpuCompileResult.as_dict()` (a failed compile has `ok` False and its `error`).
"""

from __future__ import annotations

import json
import os

GB = 1e9
SCOPE = (
    "Compiled by XLA's GPU compiler for the target without the device (deviceless AOT): memory, fusion, kernel "
    "choice (custom calls) and the collective schedule are what the compiler produces; nothing is autotuned "
    "(GEMM tiling is the compiler's default), so kernel speed is not measured here."
)


def _gb(x: float) -> str:
    return f"{x / GB:.2f} GB"


def target_section(r: dict) -> list[str]:
    """Markdown lines for one target."""
    head = [f"## {r['target']} ({r['platform']}, topology {r['topology']}, mesh {r['mesh']})", "", f"`{r['line']}`", ""]
    head += [f"- model.kernels resolved to: {r['kernels']}"] if r.get("kernels") else []
    if not r["ok"]:
        return head + [f"Compile failed: {r['error']}", ""]
    m, p = r["memory"], r["program"]
    lines = head + [
        f"- lower {r['lower_s']:.1f} s, compile {r['compile_s']:.1f} s",
        f"- memory per device: arguments {_gb(m['argument'])}, outputs {_gb(m['output'])}, aliased "
        f"{_gb(m['alias'])}, temporaries {_gb(m['temp'])} -> peak {_gb(m['peak'])} of {_gb(r['hbm_bytes'])} HBM "
        f"({_gb(r['usable_bytes'])} usable): {'fits' if r['fits'] else 'DOES NOT FIT'}",
        f"- expert GEMMs: {p['expert_gemms'] or 'none found'}; executed {r['expert_flops_executed']:.4g} FLOPs "
        f"per device vs routed {r['expert_flops_routed']:.4g} -> {r['expert_ratio']:.2f}x",
        f"- attention: {p['attention']}; [.., S, S] buffers: {len(p['square_buffers'])}"
        + (
            f" ({', '.join(p['square_buffers'][:4])}{', ...' if len(p['square_buffers']) > 4 else ''})"
            if p["square_buffers"]
            else ""
        ),
        f"- kernels: {p['fusions']} fusions, {p['dots']} dots, custom calls "
        + (", ".join(f"{k} x{v}" for k, v in sorted(p["custom_calls"].items())) or "none"),
        f"- dot FLOPs per device per step {r['dot_flops']:.4g}; HBM traffic of the top-level kernels "
        f"{_gb(r['hbm_traffic_bytes'])} per step (loop trip counts applied); XLA cost analysis bytes accessed "
        f"{_gb(r['xla_cost_bytes_accessed'])} (loop bodies once)",
        f"- collectives: {p['async']} async ({p['async_with_gemms']} with a GEMM between start and done), "
        f"{p['sync']} synchronous",
    ]
    if p["collectives"]:
        lines += ["", "| collective | computation | async | GEMMs between (in loops) | other kernels between |"]
        lines += ["|---|---|---|---|---|"]
        for c in p["collectives"]:
            lines.append(
                f"| {c['kind']} `{c['name']}` | `{c['computation'][:48]}` | {'no' if c['sync'] else 'yes'} | "
                f"{c['gemms_between']}{_in_loops(c)} | {c['fusions_between']} |"
            )
    lines += [f"- XLA flags: {' '.join(r.get('flags', ())) or 'none'}"]
    lines += [f"- note: {n}" for n in r.get("notes", [])]
    return lines + [""]


def write(out_dir: str, results: list[dict], *, command: str, setup: dict) -> list[str]:
    """Write report.md and report.json into `out_dir` (which exists); returns the paths written."""
    md = ["# GPU compile check", "", f"`{command}`", "", SCOPE, "", f"Setup: {setup}", ""]
    for r in results:
        md += target_section(r)
    paths = [os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.json")]
    with open(paths[0], "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    with open(paths[1], "w", encoding="utf-8") as f:
        json.dump({"command": command, "setup": setup, "targets": results}, f, indent=2, default=str)
    return paths


def _in_loops(c: dict) -> str:
    """' (in 1 loop)' for a collective with while loops between its start and done (their GEMMs counted once)."""
    loops = c.get("loops_between", 0)
    return f" (in {loops} loop{'s' if loops > 1 else ''})" if loops else ""
