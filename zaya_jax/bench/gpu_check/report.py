"""The first-contact report: one CSV row per measurement, one Markdown section per check section.

Every section returns a `Section` (its rows, notes and wall time). A row is one measurement:
`section, case, metric, value, unit, check, note`, where `check` is `pass` / `fail` (a failed check: the
command exits non-zero), `error` (a non-default kernel that failed to compile or run: its one-line error in
`note`, not a failure) or empty (a plain measurement). `report.md` shows each section as a table with one line
per case and one column per metric, followed by its checks and notes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from zaya_jax.bench import common

COLUMNS = ("section", "case", "metric", "value", "unit", "check", "note")
PASS, FAIL, ERROR = "pass", "fail", "error"


def row(section: str, case: str, metric: str, value: Any, unit: str = "", check: str = "", note: str = "") -> dict:
    """One measurement (see the module docstring)."""
    return dict(section=section, case=case, metric=metric, value=value, unit=unit, check=check, note=note)


def sig(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant digits (report values; NaN and inf unchanged)."""
    return float(f"{x:.{digits}g}")


def one_line(err: BaseException) -> str:
    """`Type: first line of the message` (XLA errors carry pages of HLO after the first line)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


@dataclasses.dataclass
class Section:
    """A section's result: `key` (CSV `section`), `title` (Markdown heading), rows, notes, wall seconds."""

    key: str
    title: str
    rows: list[dict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0

    def add(self, case: str, metric: str, value: Any, unit: str = "", check: str = "", note: str = "") -> dict:
        r = row(self.key, case, metric, value, unit, check, note)
        self.rows.append(r)
        return r

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.rows if r["check"] == FAIL]


def timed(key: str, title: str, body: Callable[[Section], None], log: Callable[[str], None] = print) -> Section:
    """Run `body(section)` and record its wall time; an exception in the body becomes one failed row (a section
    that crashes is a failed check, never a crash of the whole command)."""
    import time

    section = Section(key, title)
    log(f"gpu_check: {title} ...")
    t0 = time.perf_counter()
    try:
        body(section)
    except Exception as err:  # noqa: BLE001 — reported as a failed check with its one-line error
        section.add("section", "error", "", check=FAIL, note=one_line(err))
    section.wall_s = time.perf_counter() - t0
    section.add("section", "wall_s", round(section.wall_s, 2), "s")
    log(f"gpu_check: {title}: {section.wall_s:.1f} s, {len(section.failures)} failed check(s)")
    return section


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|")


def section_table(section: Section) -> str:
    """Cases as lines, metrics as columns (value + unit); the section's wall time is in the heading."""
    rows = [r for r in section.rows if r["case"] != "section" and r["metric"] != "error"]
    if not rows:
        return ""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    if len(rows) < len(cases) * len(metrics) / 2:  # mostly empty as a grid (versions, environment): a list
        lines = ["| case | metric | value |", "|---|---|---|"]
        lines += [
            f"| {r['case']} | {r['metric']} | {_fmt(r['value'])}{' ' + r['unit'] if r['unit'] else ''} |" for r in rows
        ]
        return "\n".join(lines)
    cells = {(r["case"], r["metric"]): (_fmt(r["value"]) + (f" {r['unit']}" if r["unit"] else "")) for r in rows}
    lines = ["| case | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 1)]
    lines += ["| " + " | ".join([c] + [cells.get((c, m), "") for m in metrics]) + " |" for c in cases]
    return "\n".join(lines)


def section_markdown(section: Section) -> str:
    checks = [r for r in section.rows if r["check"] or r["metric"] == "error"]
    parts = [section_table(section)]
    if checks:
        parts.append(
            "Checks:\n\n"
            + "\n".join(
                f"- **{r['check'] or 'info'}** {r['case']} / {r['metric']}"
                + (f" = {_fmt(r['value'])}{' ' + r['unit'] if r['unit'] else ''}" if r["value"] != "" else "")
                + (f": {r['note']}" if r["note"] else "")
                for r in checks
            )
        )
    if section.notes:
        parts.append("Notes:\n\n" + "\n".join(f"- {n}" for n in section.notes))
    return "\n\n".join(p for p in parts if p)


def write(out_dir: str, title: str, sections: Sequence[Section], *, command: str | None = None) -> list[str]:
    """DIR/report.csv (every row of every section) and DIR/report.md; returns the file names."""
    rows = [r for s in sections for r in s.rows]
    failed = [r for r in rows if r["check"] == FAIL]
    os.makedirs(out_dir, exist_ok=True)
    common.write_csv(os.path.join(out_dir, "report.csv"), rows, COLUMNS)
    names = "; ".join(f"{r['section']} / {r['case']} / {r['metric']}" for r in failed)
    verdict = f"**{len(failed)} failed check(s)**: {names}" if failed else "**all checks passed**"
    total = sum(s.wall_s for s in sections)
    walls = ", ".join(f"{s.key} {s.wall_s:.1f} s" for s in sections)
    body = [("Result", f"{verdict}\n\nWall time {total:.1f} s: {walls}.")]
    body += [(f"{s.title} ({s.wall_s:.1f} s)", section_markdown(s)) for s in sections]
    common.write_markdown(os.path.join(out_dir, "report.md"), title, body, command=command)
    return ["report.csv", "report.md"]
