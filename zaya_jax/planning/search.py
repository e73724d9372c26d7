"""Layout search (docs/planner.md, "Searching for a layout"): which layout of a config runs fastest on a cluster.

Branch and bound over `layouts.enumerate_layouts`, with compiles as the cost:

1. every layout gets an analytic estimate without compiling (`estimate`): compute = the analytic hardware
   FLOPs (model, capacity padding, remat recompute, Newton–Schulz balanced over devices) at the bf16 peak,
   memory-bound time from `projection.hbm_traffic`, the ZeRO-1 minimum collectives priced on the cluster —
   the step's top-level reduce-scatter and all-gather exposed, the per-layer ones (expert all-to-all,
   context parallel) hidden up to the compute — and a floor under its memory per device (parameters' compute
   copy, gradients, ZeRO-1 shards, the residual stream every remat policy keeps);
2. layouts whose memory floor exceeds the usable memory are dropped ("cannot fit");
3. the rest are planned (`plan.plan`: the real step compiled on the emulated mesh) in order of their
   estimated step time, until the compile budget is spent; a layout whose compute + memory-bound time alone
   (every collective hidden: its best case) is no faster than the best planned overlapped step is skipped
   ("cannot win"), and so is one whose estimate is past it by more than `slack`; a planned layout that does
   not fit (its estimated peak beyond `ESTIMATE_SLACK` × usable) rules out every layout of its mesh that needs
   at least its memory (`needs_more_memory`), and every planned layout bounds the peak of the layouts with
   its remat and expert axis and fewer tokens per device per micro-batch (`predicted_peak`);
4. the planned layouts are ranked by projected overlapped tokens/s per device (`plan` → `overlap`), those
   whose estimated peak on a bf16 accelerator does not fit last.

Plans are cached on disk by a hash of everything that decides them (the planned config, hardware, cluster,
compile options, jax version), so a second search — or one with a larger budget — compiles only what is new.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from zaya_jax.hardware import get_hardware
from zaya_jax.planning import projection
from zaya_jax.planning.abstract_step import planning_config
from zaya_jax.planning.cluster import Cluster, Stage
from zaya_jax.planning.flops import analytic_flops, effective_capacity_factor
from zaya_jax.planning.layouts import Layout

# The GPU compiler's peak per device has come out up to 42% below the planner's estimate for a bf16 accelerator
# (ZAYA1-base at 128 x 8 MI300X, expert parallel, remat none: 143 -> 101 GB, 88 -> 65 GB; docs/planner.md), so a
# layout is ruled out on its estimate only beyond this factor of the usable memory; the GPU compile decides.
ESTIMATE_SLACK = 1.5
TOP_LEVEL = ("gradient_reduce_scatter", "parameter_all_gather")  # ZeRO-1's: issued after the layer loops


def layout_config(config: ml_collections.ConfigDict, layout: Layout) -> ml_collections.ConfigDict:
    """`config` set up to plan `layout` (`planning_config`: the ep dispatch at the layout's capacity factor,
    which at capacity 1 on a data-only mesh computes what the dropless GEMMs do)."""
    cfg, _ = planning_config(
        config,
        mesh=layout.mesh,
        batch_per_device=layout.sequences,
        microbatches=layout.microbatches,
        remat=layout.remat,
        dispatch="ep",
        capacity_factor=layout.capacity_factor,
        num_devices=layout.devices,
    )
    with cfg.unlocked():
        cfg.model.capacity_factor = float(layout.capacity_factor)
        cfg.train.overlap_collectives = layout.overlap_collectives
    return cfg


def fixed_memory(cfg: ml_collections.ConfigDict, params: Any, n: int) -> float:
    """Bytes per device every step of `cfg` holds whatever its batch: the compute copy of its local parameters
    and their gradients (compute dtype each) and the fp32 master and two moments of its 1/n ZeRO-1 shard."""
    b = projection.dtype_bytes(cfg.model.dtype)
    leaves = jax.tree.leaves(params)
    local = sum(projection.compute_copy(x, cfg, n)[0] for x in leaves)
    total = sum(math.prod(x.shape) for x in leaves)
    return local * 2 * b + total * 3 * projection.MASTER_BYTES / n


def residual_stream_bytes(cfg: ml_collections.ConfigDict, n: int) -> float:
    """The fp32 residual stream of every layer of one micro-batch per device: what even full remat keeps for
    the backward (with `fixed_memory`, the floor no layout of `cfg` goes below)."""
    m, t = cfg.model, cfg.train
    tokens = t.global_batch_size // t.microbatches * t.seq_len / n
    return m.num_layers * tokens * m.hidden_size * 4


def predicted_peak(c: "Candidate", planned: "Candidate") -> float | None:
    """An estimate from below of `c`'s peak from the compiled peak of `planned`, a layout with the same remat,
    expert axis and capacity and at least as many tokens per device per micro-batch (None otherwise). The
    peak is fixed memory F plus activations in proportion to those tokens t: P = F + a·t. Through the
    compiled (t₁, P₁) and `fixed_memory` f ≤ F: P ≈ f_c + (P₁ − f₁)·t/t₁, below the truth for t ≤ t₁ when
    f falls short of F by the same amount on both meshes (exactly so on the same mesh)."""
    a, b = c.layout, planned.layout
    same = (a.remat, a.expert, a.capacity_factor) == (b.remat, b.expert, b.capacity_factor)
    share = (a.sequences / a.context) / (b.sequences / b.context)  # t / t₁: the sequence length is the search's
    if not same or share > 1 or planned.plan is None:
        return None
    peak = planned.plan["memory"]["peak_without_cpu_copies"]
    return c.estimate["fixed_memory"] + (peak - planned.estimate["fixed_memory"]) * share


def estimate(cfg: ml_collections.ConfigDict, params: Any, n: int, hardware: str, cluster: Cluster) -> dict:
    """Analytic step of a planned config (module docstring, 1): seconds per part, `step_s`, `floor_s`
    (compute + memory-bound: every collective hidden), `mfu`, and `memory_floor` bytes."""
    hw = get_hardware(hardware)
    flops = analytic_flops(cfg, n, params)
    compute = (flops["hardware"] - flops["muon_newton_schulz"] * (1 - 1 / n)) / n / hw.peak_bf16_flops
    ridge = hw.peak_bf16_flops / (hw.hbm_bandwidth * cluster.hbm_efficiency)
    traffic = projection.hbm_traffic(cfg, params, n, effective_capacity_factor(cfg, n), 1.0 / n, ridge)
    memory = traffic["total"] / (hw.hbm_bandwidth * cluster.hbm_efficiency)
    _, times = projection.zero1_minimum(cfg, params, n, cluster)
    top = sum((times[k] for k in TOP_LEVEL), Stage()).seconds
    in_loops = sum((v for k, v in times.items() if k not in TOP_LEVEL), Stage()).seconds
    step = compute + memory + top + max(0.0, in_loops - compute)
    fixed = fixed_memory(cfg, params, n)
    return {
        "compute_s": compute,
        "memory_s": memory,
        "collective_s": top + in_loops,
        "step_s": step,
        "floor_s": compute + memory,
        "mfu": flops["model"] / n / (step * hw.peak_bf16_flops),
        "memory_floor": fixed + residual_stream_bytes(cfg, n),
        "fixed_memory": fixed,
    }


@dataclasses.dataclass
class Candidate:
    """A layout, its planned config and estimate; `plan` once compiled, else why it was not (`skipped`)."""

    layout: Layout
    config: ml_collections.ConfigDict
    estimate: dict
    plan: dict | None = None
    cached: bool = False
    skipped: str = ""

    @property
    def overlapped_tokens_per_s(self) -> float:
        return self.plan["projection"]["overlapped"]["tokens_per_s_per_device"] if self.plan else 0.0

    @property
    def mfu(self) -> float:
        return self.plan["summary"]["projected_mfu_overlapped"] if self.plan else 0.0

    def _peak_within(self, estimate_factor: float) -> bool:
        """Planned, and its GPU-compiled peak fits the usable memory, or without one its estimate for a bf16
        accelerator (the XLA:CPU peak less the fp32 parameter copies only XLA:CPU makes) fits
        `estimate_factor` × the usable memory."""
        if not self.plan:
            return False
        mem = self.plan["memory"]
        if "peak_gpu_compiled" in mem:
            return mem["peak_gpu_compiled"] <= mem["usable"]
        return mem["peak_without_cpu_copies"] <= estimate_factor * mem["usable"]

    @property
    def fits(self) -> bool:
        """Fits on the target: by the GPU-compiled peak where there is one, else by the estimate."""
        return self._peak_within(1.0)

    @property
    def may_fit(self) -> bool:
        """Not ruled out: the estimate is within `ESTIMATE_SLACK` of the usable memory (the GPU compiler may need
        that much less), or the GPU-compiled peak fits."""
        return self._peak_within(ESTIMATE_SLACK)


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Planned layouts first, those that fit before those that do not, each by overlapped tokens/s, best first."""
    return sorted(candidates, key=lambda c: (c.plan is None, not c.fits, -c.overlapped_tokens_per_s))


REMAT_MEMORY = {"full": 0, "dots_no_batch": 1, "dots": 2, "none": 3}  # activations kept, fewest first


def needs_more_memory(a: Layout, b: Layout) -> bool:
    """Whether layout `a` needs at least the memory per device of `b`: the same mesh, no fewer sequences per
    micro-batch, a remat policy that keeps at least as much, and no smaller expert capacity."""
    return (
        a.mesh == b.mesh
        and a.sequences >= b.sequences
        and REMAT_MEMORY[a.remat] >= REMAT_MEMORY[b.remat]
        and a.capacity_factor >= b.capacity_factor
    )


def plan_key(cfg: ml_collections.ConfigDict, **settings: Any) -> str:
    """A hash of everything that decides a plan: the config, the planner's settings and jax's version."""
    text = json.dumps([cfg.to_dict(), settings, jax.__version__], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class PlanCache:
    """Plans as JSON files in `folder` (None: no cache), one per `plan_key`."""

    def __init__(self, folder: str | None):
        self.folder = folder
        if folder:
            os.makedirs(folder, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, f"{key}.json")

    def get(self, key: str) -> dict | None:
        if not self.folder or not os.path.exists(self._path(key)):
            return None
        try:
            with open(self._path(key), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):  # unreadable: planned again and rewritten
            return None

    def put(self, key: str, result: dict) -> None:
        if self.folder:
            tmp = self._path(key) + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(result, f, default=str)
            os.replace(tmp, self._path(key))  # a search cut off mid-write leaves no half file


def search(
    candidates: list[Candidate],
    plan_fn: Callable[[ml_collections.ConfigDict], dict],
    *,
    budget: int,
    usable: float,
    cache: PlanCache,
    settings: dict,
    slack: float = 1.5,
    on_step: Callable[[Candidate], None] | None = None,
) -> list[Candidate]:
    """Plan the candidates in order of their estimate within `budget` compiles (module docstring, 2–4);
    returns them all, planned ones first, best first. Cached plans cost no compile."""
    for c in candidates:
        if c.estimate["memory_floor"] > usable:
            c.skipped = f"cannot fit: needs at least {c.estimate['memory_floor'] / 1e9:.0f} GB"
    compiles, best = 0, math.inf  # best: the fastest planned overlapped step that fits, seconds
    for c in sorted((c for c in candidates if not c.skipped), key=lambda c: c.estimate["step_s"]):
        key = plan_key(c.config, **settings)
        cached = None if c.skipped else cache.get(key)  # skipped: ruled out since the loop began
        if c.skipped:
            pass
        elif c.estimate["floor_s"] >= best:
            c.skipped = "cannot win: even with every collective hidden it is slower than the best planned"
        elif cached is None and c.estimate["step_s"] > slack * best:
            c.skipped = f"cannot win: estimated {c.estimate['step_s'] / best:.1f}× the best planned step"
        elif cached is None and compiles >= budget:
            c.skipped = "compile budget spent"
        else:
            if cached is None:
                cached = plan_fn(c.config)
                compiles += 1
                cache.put(key, cached)
            else:
                c.cached = True
            c.plan = cached
            if c.fits:
                best = min(best, cached["projection"]["overlapped"]["step_s"])
            rule_out_by_memory(candidates, c, usable)
        if on_step is not None:
            on_step(c)
    return rank(candidates)


def rule_out_by_memory(candidates: list[Candidate], planned: Candidate, usable: float) -> None:
    """Skip the unplanned candidates whose memory `planned`'s compile puts out of reach (module docstring, 3)."""
    for other in candidates:
        if other.skipped or other.plan is not None:
            continue
        if not planned.may_fit and needs_more_memory(other.layout, planned.layout):
            other.skipped = f"cannot fit: needs at least the memory of {planned.layout.name()}, which does not"
        elif (peak := predicted_peak(other, planned)) is not None and peak > ESTIMATE_SLACK * usable:
            other.skipped = f"cannot fit: at least {peak / 1e9:.0f} GB from the compiled {planned.layout.name()}"
