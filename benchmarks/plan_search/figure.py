"""Draw `search.png` from the layout searches in this folder (`launch.plan --search --out=<name>.json`): per
search, the projected overlapped MFU of the paper's layout, the 10 best planned layouts that fit and the 4 best
that do not (hatched).

    python benchmarks/plan_search/figure.py benchmarks/plan_search/*.json --out=benchmarks/plan_search/search.png
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def planned_rows(record: dict, fitting: int = 10, not_fitting: int = 4) -> list[tuple[str, float, bool]]:
    """(label, overlapped MFU, fits) of the paper's layout, then the best planned layouts that fit and not."""
    rows = []
    for i, row in enumerate([record["paper"], *record["ranked"]]):
        if "summary" not in row:
            continue
        lay = row["layout"]
        mesh = f"d{lay['data']}" + (f"×e{lay['expert']}" if lay["expert"] > 1 else "")
        mesh += f"×c{lay['context']}" if lay["context"] > 1 else ""
        label = f"{'paper: ' if i == 0 else ''}{mesh} {lay['microbatches']}×{lay['sequences']} {lay['remat']}"
        label += " +ov" if lay["overlap_collectives"] else ""
        fits = row.get("fits", True)
        rows.append((label, 100 * row["summary"]["projected_mfu_overlapped"], fits))
    fit = [r for r in rows[1:] if r[2]][:fitting]
    return [rows[0], *fit, *[r for r in rows[1:] if not r[2]][:not_fitting]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+")
    parser.add_argument("--out", default="search.png")
    args = parser.parse_args()
    fig, axes = plt.subplots(len(args.records), 1, figsize=(9, 4.2 * len(args.records)), squeeze=False)
    for ax, path in zip(axes[:, 0], args.records):
        with open(path, encoding="utf-8") as f:
            rows = planned_rows(json.load(f))
        labels, mfus, fits = zip(*rows)
        colors = ["tab:gray"] + ["tab:blue"] * (len(rows) - 1)
        bars = ax.barh(range(len(rows)), mfus, color=colors)
        for bar, ok in zip(bars, fits):
            if not ok:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("projected MFU, overlapped (%)")
        ax.set_title(os.path.splitext(os.path.basename(path))[0], fontsize=10)
        for y, v in enumerate(mfus):
            ax.text(v, y, f" {v:.1f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
