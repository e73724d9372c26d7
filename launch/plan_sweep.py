"""`launch.plan --sweep`: plan one layout at several device counts, each in its own process (the emulated
CPU device count is fixed when jax starts), and write `sweep.csv` + `sweep.png` (projected tokens/s per
device and MFU against GPU count, the shape of the scaling figure of arXiv 2511.17127) into `--out`.

Sweep syntax: comma-separated points; a point is `axis:N` or `axis:N+axis:M`; a bare `N` repeats the previous
point with its first axis set to N. `data:8,64,128,1024` = data:8, data:64, data:128, data:1024;
`data:16+context:8,128` = data:16 × context:8 and data:128 × context:8.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys

from launch import cli
from zaya_jax.parallel.mesh import AXES

SWEEP_FLAGS = ("sweep", "out", "mesh", "cpu_devices")  # set per point; everything else is passed through
CSV_COLUMNS = (
    "mesh",
    "devices",
    "nodes",
    "microbatches",
    "global_batch",
    "seq_len",
    "tokens_per_step",
    "remat",
    "step_ms",
    "compute_ms",
    "memory_ms",
    "collective_ms",
    "tokens_per_s_per_device",
    "projected_mfu",
    "overlapped_step_ms",
    "projected_mfu_overlapped",
    "ideal_step_ms",
    "ideal_tokens_per_s_per_device",
    "ideal_mfu",
    "executed_over_analytic_flops",
    "optimizer_over_newton_schulz",
    "wire_over_zero1_minimum",
    "wire_gb_per_device",
    "zero1_minimum_gb_per_device",
    "peak_memory_gb",
    "fits",
)


def parse_sweep(text: str) -> list[dict[str, int]]:
    """`--sweep` text → one {axis: size} per point (see the module docstring); ValueError on bad input."""
    points: list[dict[str, int]] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        if item.isdigit():
            if not points:
                raise ValueError(f"--sweep={text!r}: the first point needs an axis name, e.g. data:{item}")
            point = dict(points[-1])
            point[next(iter(point))] = int(item)
        else:
            point = {}
            for part in item.split("+"):
                m = re.fullmatch(r"(\w+):(\d+)", part.strip())
                if not m:
                    raise ValueError(
                        f"--sweep point {item!r}: use axis:size[+axis:size], e.g. data:64 or data:16+context:8"
                    )
                point[m.group(1)] = int(m.group(2))
        points.append(point)
    if not points:
        raise ValueError("--sweep is empty: give points such as data:8,64,128")
    for point in points:  # every point checked before anything is written
        bad = [f"{axis}:{size}" for axis, size in point.items() if axis not in AXES or size < 1]
        if bad:
            raise ValueError(
                f"--sweep point {mesh_text(point)!r}: {bad[0]} is not axis:size with an axis of "
                f"{', '.join(AXES)} and a size >= 1"
            )
    return points


def mesh_text(point: dict[str, int]) -> str:
    return ",".join(f"{axis}:{size}" for axis, size in point.items())


def passthrough(argv: list[str]) -> list[str]:
    """argv without the flags the sweep sets per point (`--flag=v` and `--flag v` forms)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("--") and name in SWEEP_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def run_point(point: dict[str, int], argv: list[str], out_dir: str) -> dict:
    """Plan one point in a subprocess; returns its result dict (report text in plan_<mesh>.txt)."""
    label = mesh_text(point).replace(":", "").replace(",", "_")
    json_path, text_path = (os.path.join(out_dir, f"plan_{label}.{ext}") for ext in ("json", "txt"))
    devices = math.prod(point.values())
    cmd = [
        sys.executable,
        "-m",
        "launch.plan",
        *passthrough(argv),
        f"--mesh={mesh_text(point)}",
        f"--cpu_devices={devices}",
        f"--out={json_path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)  # its own --cpu_devices wins over XLA_FLAGS
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ValueError(f"sweep point {mesh_text(point)} failed: {tail[0]} (full log: {text_path})")
    with open(json_path, encoding="utf-8") as f:
        return json.load(f)


def csv_row(result: dict, gpus_per_node: int) -> dict:
    s, p, su = result["setup"], result["projection"], result["summary"]
    pr, ideal = p["projected"], p["ideal"]
    return {
        "mesh": mesh_text({k: v for k, v in s["mesh"].items() if v > 1} or {"data": 1}),
        "devices": s["devices"],
        "nodes": -(-s["devices"] // gpus_per_node),
        "microbatches": s["microbatches"],
        "global_batch": s["global_batch"],
        "seq_len": s["seq_len"],
        "tokens_per_step": s["tokens_per_step"],
        "remat": s["remat"],
        "step_ms": 1e3 * pr["step_s"],
        "compute_ms": 1e3 * pr["compute_s"],
        "memory_ms": 1e3 * pr["memory_s"],
        "collective_ms": 1e3 * pr["collective_s"],
        "tokens_per_s_per_device": pr["tokens_per_s_per_device"],
        "projected_mfu": pr["mfu"],
        "overlapped_step_ms": 1e3 * p["overlapped"]["step_s"],
        "projected_mfu_overlapped": p["overlapped"]["mfu"],
        "ideal_step_ms": 1e3 * ideal["step_s"],
        "ideal_tokens_per_s_per_device": ideal["tokens_per_s_per_device"],
        "ideal_mfu": ideal["mfu"],
        "executed_over_analytic_flops": su["executed_over_analytic_hardware_flops"],
        "optimizer_over_newton_schulz": su["optimizer_over_newton_schulz_flops"],
        "wire_over_zero1_minimum": su["collective_wire_over_zero1_minimum"],
        "wire_gb_per_device": result["collective_wire_bytes_per_device"] / 1e9,
        "zero1_minimum_gb_per_device": p["zero1_minimum_wire_bytes"]["total"] / 1e9,
        "peak_memory_gb": result["memory"]["peak"] / 1e9,
        "fits": result["fits"],
    }


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def write_png(rows: list[dict], path: str, title: str) -> None:
    """Two panels against GPU count (log2 axis): tokens/s per device and MFU, projected and at the minimum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["devices"])
    gpus = [r["devices"] for r in rows]
    fig, (ax_tok, ax_mfu) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label, scale in (
        (ax_tok, "tokens_per_s_per_device", "tokens/s per GPU", 1.0),
        (ax_mfu, "mfu", "MFU (%)", 100.0),
    ):
        ax.plot(
            gpus,
            [scale * r[f"projected_{key}" if key == "mfu" else key] for r in rows],
            "o-",
            label="compiled step (projected)",
        )
        if key == "mfu":
            ax.plot(gpus, [scale * r["projected_mfu_overlapped"] for r in rows], "^-", label="compiled, overlapped")
        ax.plot(gpus, [scale * r[f"ideal_{key}"] for r in rows], "s--", label="at the ZeRO-1 minimum")
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sweep(text: str, argv: list[str], out_dir: str, gpus_per_node: int, title: str) -> list[dict]:
    """Plan every point of `text`, write sweep.csv and sweep.png into out_dir; returns the CSV rows."""
    points = parse_sweep(text)
    cli.check_out_dir("plan", out_dir, "the sweep's files")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for point in points:
        row = csv_row(run_point(point, argv, out_dir), gpus_per_node)
        rows.append(row)
        print(
            f"{row['mesh']:>24s}: step {row['step_ms']:9.1f} ms, "
            f"{row['tokens_per_s_per_device']:9,.0f} tokens/s/GPU, projected MFU {row['projected_mfu']:.1%} "
            f"(overlapped {row['projected_mfu_overlapped']:.1%}, at the minimum {row['ideal_mfu']:.1%}), "
            f"wire/min {row['wire_over_zero1_minimum']:.2f}, optimizer/NS {row['optimizer_over_newton_schulz']:.2f}",
            flush=True,
        )
    write_csv(rows, os.path.join(out_dir, "sweep.csv"))
    write_png(rows, os.path.join(out_dir, "sweep.png"), title)
    print(f"wrote {os.path.join(out_dir, 'sweep.csv')} and {os.path.join(out_dir, 'sweep.png')}")
    return rows
