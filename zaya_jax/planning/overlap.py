"""How much of a compiled step's collective time can hide under its compute (docs/planner.md, docs/parallelism.md).

The planner's plain projection adds compute, memory-bound time and collectives in series. On an accelerator,
XLA's latency-hiding scheduler runs a collective concurrently with compute that does not depend on it — but
only compute it can reach: work of the same computation (a `while` body is scheduled on its own, one iteration
at a time, with the next iteration's collective pipelined against this one's compute). So the rule here is:

* a collective issued in a `while` body hides under at most that body's own dot FLOPs per run at the bf16 peak
  — not those of a nested `while`: the GPU compiler does not schedule across one (ZAYA1-base at data:8 with
  `train.overlap_collectives`, compiled for H100, H200 and MI300X: each layer chunk's backward is a nested
  loop, and no chunk reduce-scatter has a GEMM between its start and done); all collectives of the body share
  that cover; and only
  (trips − 1) of every `trips` runs hide: a collective overlaps with another iteration's compute (the
  scheduler pipelines it into the next iteration, e.g. the reduce-scatter of what this iteration's backward
  produced, or the all-gather of what the next iteration's forward needs), so one per loop execution stays
  exposed;
* a collective issued at the step's top level hides under the top level's compute that it neither feeds nor
  waits for (`hlo_stats.top_level_cover`: dots, fusions and loops with dot FLOPs, at the peak), shared by all
  such collectives, less the smallest of those that wait for some of that compute (one of them is issued
  after the last of it): with the pipelined ZeRO-1 update (`train.pipeline_update`), layer chunk c's
  parameter all-gather runs beside the other chunks' Newton–Schulz, and all but one chunk's can hide. The
  gradient reduce-scatter hides nothing: everything after it needs the clipping's global norm, everything
  before it feeds it (GPU compiles of ZAYA1-base at data:8 on H100 and MI300X, docs/parallelism.md);
* a collective issued anywhere else (a conditional's branch) hides nothing;
* memory-bound work is not counted as cover (it competes for the same HBM the collectives read), so the
  overlapped step = compute + memory-bound + exposed collectives.

For every body with collectives: per run, its collectives' priced seconds (`cluster.Cluster.collective`) and
its compute seconds; hidden = min of the two × the body's runs per step × (trips − 1) / trips. At the top
level: hidden = min(covered collectives' seconds − the smallest waiting one's, cover seconds).
"""

from __future__ import annotations

import dataclasses

from zaya_jax.planning.cluster import Cluster
from zaya_jax.planning.hlo_stats import HloStats


@dataclasses.dataclass(frozen=True)
class BodyOverlap:
    """Collectives of one computation per step: `runs` executions of it, each with `collective_s` of
    collectives and `compute_s` of dot FLOPs; `hidden_s` (per step) of the collectives overlap with compute."""

    computation: str
    loop: bool  # a while body (its collectives may hide), else the top level or a branch
    trips: int  # iterations of that loop per execution of it (1 when not a loop)
    runs: float
    collective_s: float  # per run
    compute_s: float  # per run
    kinds: tuple[str, ...]
    # the top level (`top_level_cover`): seconds of its collectives with independent compute beside them, of
    # the smallest of those that waits for some of it, and of that compute
    covered_s: float = 0.0
    waiting_s: float = 0.0
    cover_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.runs * self.collective_s

    @property
    def hidden_s(self) -> float:
        if not self.loop:
            return max(0.0, min(self.covered_s - self.waiting_s, self.cover_s))
        if self.trips < 2:
            return 0.0
        return self.runs * (self.trips - 1) / self.trips * min(self.collective_s, self.compute_s)

    @property
    def exposed_s(self) -> float:
        return self.total_s - self.hidden_s


def bodies(stats: HloStats, cluster: Cluster, peak_flops: float) -> list[BodyOverlap]:
    """Every computation of `stats` that issues a collective, with its overlap (module docstring)."""
    per_run: dict[str, float] = {}
    runs: dict[str, float] = {}
    kinds: dict[str, set[str]] = {}
    covered: dict[str, list[tuple[float, bool]]] = {}  # top level: (seconds, waits) of collectives with cover
    for op, executions in stats.collective_ops:
        seconds = cluster.collective(op).seconds
        per_run[op.computation] = per_run.get(op.computation, 0.0) + seconds
        runs[op.computation] = max(runs.get(op.computation, 0.0), executions)
        kinds.setdefault(op.computation, set()).add(op.kind)
        if stats.top_cover.get(op.name):
            covered.setdefault(op.computation, []).append((executions * seconds, stats.top_waits[op.name]))
    cover_s = sum(stats.top_flops.values()) / peak_flops
    out = []
    for comp in sorted(per_run, key=lambda c: -per_run[c] * runs[c]):
        top = covered.get(comp, [])
        waiting = [s for s, waits in top if waits]
        out.append(
            BodyOverlap(
                comp,
                comp in stats.trip_counts,
                stats.trip_counts.get(comp, 1),
                runs[comp],
                per_run[comp],
                stats.flops_per_run.get(comp, 0.0) / peak_flops,
                tuple(sorted(kinds[comp])),
                sum(s for s, _ in top),
                min(waiting, default=0.0),
                cover_s if top else 0.0,
            )
        )
    return out


def overlapped(projected: dict, rows: list[BodyOverlap], model_flops: float, peak_flops: float) -> dict:
    """The projected step (`projection.project`'s dict) with the hidden collective time taken off."""
    hidden = sum(r.hidden_s for r in rows)
    step_s = projected["step_s"] - hidden
    return {
        "hidden_s": hidden,
        "exposed_s": projected["collective_s"] - hidden,
        "step_s": step_s,
        "tokens_per_s_per_device": projected["tokens_per_s_per_device"] * projected["step_s"] / step_s,
        "mfu": model_flops / (step_s * peak_flops),
        "bodies": [dataclasses.asdict(r) | {"hidden_s": r.hidden_s, "exposed_s": r.exposed_s} for r in rows],
    }


def describe() -> list[str]:
    """The overlap assumptions, printed with the fifth summary line."""
    return [
        "a collective issued in a while body hides under at most that body's dot FLOPs per run at the peak "
        "(shared by all its collectives), in (trips - 1) of trips runs (pipelined into the next iteration); "
        "at the top level under the compute it neither feeds nor waits for (e.g. the pipelined update's "
        "Newton-Schulz beside the other chunks' all-gathers), less the smallest collective that waits for "
        "some of it; in conditional branches it hides nothing",
        "memory-bound work is no cover; overlapped step = compute + memory-bound + exposed collectives",
    ]
