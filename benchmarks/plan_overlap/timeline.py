"""Draw one training step's projected timeline from `launch.plan --out=...json` files (docs/parallelism.md).

    python benchmarks/plan_overlap/timeline.py OUT.png LABEL=plan.json [LABEL=plan.json ...]   # split at the last "="

Per plan, three lanes on one time axis (ms): compute (every executed dot FLOP at the bf16 peak), memory-bound
passes (the analytic byte model), collectives — the part the planner counts as hidden under the compute of
the loop body it is issued in (`zaya_jax/planning/overlap.py`) drawn hatched under the end of the backward pass, the
exposed rest after it. The planner's model adds the three in series; only hidden collectives overlap.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"compute": "#4C72B0", "memory": "#DD8452", "hidden": "#55A868", "exposed": "#C44E52"}


def lanes(plan: dict) -> tuple[list[tuple[str, float, float, str, str]], dict]:
    """(lane, start ms, width ms, color key, hatch) bars of one plan, and its overlapped projection."""
    p = plan["projection"]
    pr, ov = p["projected"], p["overlapped"]
    compute, memory = 1e3 * pr["compute_s"], 1e3 * pr["memory_s"]
    hidden, exposed = 1e3 * ov["hidden_s"], 1e3 * ov["exposed_s"]
    end = compute + memory
    return [
        ("compute", 0.0, compute, "compute", ""),
        ("memory-bound", compute, memory, "memory", ""),
        ("collectives", end - hidden, hidden, "hidden", "//"),
        ("collectives", end, exposed, "exposed", ""),
    ], ov


def main(out: str, specs: list[str]) -> None:
    fig, axes = plt.subplots(len(specs), 1, figsize=(11, 2.2 * len(specs) + 0.9), sharex=True, squeeze=False)
    for ax, spec in zip(axes[:, 0], specs):
        label, path = spec.rsplit("=", 1)
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
        bars, ov = lanes(plan)
        names = ["compute", "memory-bound", "collectives"]
        for lane, start, width, key, hatch in bars:
            y = len(names) - 1 - names.index(lane)
            ax.barh(y, width, left=start, height=0.6, color=COLORS[key], hatch=hatch, edgecolor="white")
        ax.set_yticks(range(len(names)), names[::-1])
        s, pr = plan["setup"], plan["projection"]["projected"]
        ax.set_title(
            f"{label} — data:{s['devices']}, {s['microbatches']} micro-batches\n"
            f"step {1e3 * ov['step_s']:.0f} ms (serial {1e3 * pr['step_s']:.0f} ms), MFU {100 * ov['mfu']:.1f}% "
            f"overlapped / {100 * pr['mfu']:.1f}% serial; collectives hidden {1e3 * ov['hidden_s']:.0f} ms, "
            f"exposed {1e3 * ov['exposed_s']:.0f} ms",
            fontsize=9,
        )
        ax.grid(True, axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k], hatch="//" if k == "hidden" else "") for k in COLORS]
    names = ["compute", "memory-bound", "collectives hidden under loop-body compute", "collectives exposed"]
    axes[-1, 0].set_xlabel("ms per optimizer step (planner projection on the MI300X cluster model)")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.legend(handles, names, fontsize=8, loc="upper center", ncol=4)
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) < 3 or not all("=" in a for a in sys.argv[2:]):
        sys.exit("usage: timeline.py OUT.png LABEL=plan.json [LABEL=plan.json ...]")
    main(sys.argv[1], sys.argv[2:])
