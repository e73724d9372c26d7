"""`launch.plan --search`: the fastest layout of a config for a cluster (`zaya_jax.planning.search`), printed as
a table and ended by the exact `launch.train` flags of the winner (docs/planner.md, "Searching for a layout").

    python -m launch.plan --config=experiments/zaya1_base.py --seq_len=4096 --microbatches=8 \
        --search --target=mi300x --nodes=128

The global batch is the one `launch.plan` would plan for the config's own mesh (the paper's layout):
--batch_per_device × batch shards × --microbatches sequences; every layout keeps it, and the paper's layout is
planned in the same run for the comparison. With the `gpu-compile` extra the top --search_gpu_top layouts are
also compiled by the GPU compiler for --target, and their compiled peak decides whether they fit.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections

from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.planning.layouts import SPREAD_PER_SEQUENCE, Layout, enumerate_layouts
from zaya_jax.planning.search import Candidate, PlanCache, estimate, layout_config, plan_key, rank, search
from zaya_jax.train.setup import prepare_abstract
from zaya_jax.train.zero1.layout import layer_chunks

GB = 1e9


def paper_layout(cfg: ml_collections.ConfigDict) -> Layout:
    """The config's own layout as `launch.plan` sets it up (data parallel + ZeRO-1 in the paper)."""
    mesh, t = cfg.mesh, cfg.train
    shards = int(mesh.data) * int(mesh.expert)
    return Layout(
        int(mesh.data), int(mesh.expert), int(mesh.context), int(t.microbatches),
        t.global_batch_size // shards // int(t.microbatches), cfg.model.remat,
        bool(t.overlap_collectives), float(cfg.model.capacity_factor) if int(mesh.expert) > 1 else 1.0,
    )  # fmt: skip


def _training(cfg: ml_collections.ConfigDict, memo: dict):
    """The abstract training setup on the layout's mesh (one per mesh shape): parameters with their shardings,
    and the ZeRO-1 owner layouts."""
    shape = tuple(int(cfg.mesh[a]) for a in ("data", "context", "expert"))
    if shape not in memo:
        n = shape[0] * shape[1] * shape[2]
        memo[shape] = prepare_abstract(cfg, make_mesh(cfg, jax.devices()[:n]))
    return memo[shape]


def candidates_for(
    base, layouts: list[Layout], hardware: str, cluster, memo: dict, prune: bool = True
) -> tuple[list[Candidate], list[str]]:
    """(a Candidate per layout, why layouts were left out): with `prune`, an `overlap_collectives` layout whose
    owner layouts get no layer chunks to reduce-scatter in the backward pass on its mesh
    (`zero1.layout.layer_chunks`) is left out, the same program as the layout
    without it."""
    out, left_out = [], []
    for layout in layouts:
        cfg = layout_config(base, layout)
        training = _training(cfg, memo)
        # the memoised setup is per mesh shape, not per option: the chunks come from this layout's config
        if prune and layout.overlap_collectives and not layer_chunks(cfg, list(training.zero1.layout.groups))[1]:
            left_out.append(f"{layout.name()}: no layer chunks on this mesh, the same program as without +overlap")
            continue
        estimated = estimate(cfg, training.checkpoint_target.params, layout.devices, hardware, cluster)
        out.append(Candidate(layout, cfg, estimated))
    return out, left_out


def run_search(
    reference, plan_fn, *, hardware, cluster, gpus_per_node, budget, usable, cache_dir, settings, max_dropped,
    load_cv, spread=SPREAD_PER_SEQUENCE, gpu_check=None, gpu_top=2,
) -> dict:  # fmt: skip
    """Enumerate, estimate, plan within the budget and rank; `reference` is the config set up for the paper's
    layout (`planning_config`: sequence length, batch, micro-batches), from which every layout is derived.
    gpu_check(candidate) compiles a candidate for the target GPU (sets plan['gpu_compiled'] and its peak)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    n = jax.device_count()
    layouts, left_out = enumerate_layouts(
        reference,
        n,
        gpus_per_node,
        reference.train.global_batch_size,
        spread=spread,
        load_cv=load_cv,
        max_dropped=max_dropped,
    )
    cache = PlanCache(cache_dir)
    memo: dict = {}
    (paper,), _ = candidates_for(reference, [paper_layout(reference)], hardware, cluster, memo, prune=False)
    cands, same = candidates_for(reference, layouts, hardware, cluster, memo)
    left_out += same
    paper.config = reference
    key = plan_key(reference, **settings)
    paper.plan = cache.get(key)
    paper.cached = paper.plan is not None
    if paper.plan is None:
        print("planning the paper's layout first …", flush=True)
        paper.plan = plan_fn(reference)
        cache.put(key, paper.plan)
    with tqdm(total=len(cands), desc="layouts", unit="layout", dynamic_ncols=True) as bar:

        def step(c: Candidate) -> None:
            bar.set_postfix_str(c.layout.name()[:60])
            bar.update(1)

        ranked = search(cands, plan_fn, budget=budget, usable=usable, cache=cache, settings=settings, on_step=step)
    if gpu_check is not None:  # the fastest that may fit, until gpu_top of them fit when compiled (2·gpu_top tries)
        fitting, tries = 0, 0
        for c in sorted((c for c in ranked if c.may_fit), key=lambda c: -c.overlapped_tokens_per_s):
            if fitting >= gpu_top or tries >= 2 * gpu_top:
                break
            gpu_check(c)
            fitting, tries = fitting + c.fits, tries + 1
        ranked = rank(ranked)
    same = [c for c in ranked if c.plan is not None and plan_key(c.config, **settings) == key]
    if same:  # the paper's layout was also a candidate: one plan, with its GPU compile if it got one
        paper.plan = same[0].plan
    return {"ranked": ranked, "paper": paper, "left_out": left_out, "wall_s": time.perf_counter() - t0}


def _peaks(c: Candidate) -> str:
    mem = c.plan["memory"]
    gpu = mem.get("peak_gpu_compiled")
    compiled = f"{gpu / GB:6.1f}" if gpu else "     -"
    return f"{mem['peak_without_cpu_copies'] / GB:6.1f} {compiled} {mem['peak'] / GB:6.1f}"


def format_search(out: dict, target_name: str, num_nodes: int, gpus_per_node: int) -> list[str]:
    """The table of planned layouts, what was left out and why, and the closing lines."""
    ranked, paper = out["ranked"], out["paper"]
    planned = [c for c in ranked if c.plan is not None]
    lines = [
        f"layout search on {num_nodes} nodes × {gpus_per_node} {target_name}: {len(ranked)} layouts, "
        f"{len(planned)} planned ({sum(not c.cached for c in planned)} compiled, "
        f"{sum(c.cached for c in planned)} from the cache)",
        "",
        f"{'#':>2} {'layout':66s} {'est MFU':>7} {'MFU':>6} {'overlap':>7} {'tok/s/dev':>9} {'dropped':>7} "
        f"{'est GB':>6} {'GPU GB':>6} {'CPU GB':>6} fits",
    ]
    for i, c in enumerate([paper, *planned]):
        p = c.plan["summary"]
        tag = "paper" if i == 0 else f"{i:2d}"
        lines.append(
            f"{tag:>2} {c.layout.name()[:66]:66s} {c.estimate['mfu']:7.1%} {p['projected_mfu']:6.1%} "
            f"{p['projected_mfu_overlapped']:7.1%} {c.overlapped_tokens_per_s:9,.0f} "
            f"{c.layout.expected_dropped:7.2%} {_peaks(c)}  {'yes' if c.fits else 'NO'}"
        )
    reasons: dict[str, int] = {}
    for c in ranked:
        if c.plan is None:
            reason = c.skipped.split(":")[0]
            reasons[reason] = reasons.get(reason, 0) + 1
    lines += ["", "not planned: " + (", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "none")]
    lines += [f"left out: {line}" for line in out["left_out"][:8]]
    if len(out["left_out"]) > 8:
        lines.append(f"left out: … {len(out['left_out']) - 8} more")
    best = next((c for c in ranked if c.plan is not None and c.fits), None)
    lines.append(f"search took {out['wall_s'] / 60:.1f} min")
    if best is None:
        return [*lines, "best layout: none fits"]
    ratio = best.overlapped_tokens_per_s / paper.overlapped_tokens_per_s
    return [
        *lines,
        f"best layout: {' '.join(best.layout.train_flags())}",
        f"projected MFU (overlapped): {best.mfu:.1%}",
        f"vs the paper's layout: {ratio:.2f}x" + ("" if paper.fits else " (the paper's layout does not fit)"),
    ]


def search_record(out: dict) -> dict:
    """The search as JSON: every layout with its estimate, plan summary and peaks, or why it was not planned."""

    def row(c: Candidate) -> dict:
        r = {"layout": c.layout.__dict__, "flags": c.layout.train_flags(), "estimate": c.estimate}
        if c.plan is None:
            return r | {"skipped": c.skipped}
        return r | {"summary": c.plan["summary"], "memory": c.plan["memory"], "fits": c.fits, "cached": c.cached,
                    "gpu_compiled": c.plan.get("gpu_compiled")}  # fmt: skip

    return json.loads(json.dumps(
        {"paper": row(out["paper"]), "ranked": [row(c) for c in out["ranked"]], "left_out": out["left_out"],
         "wall_s": out["wall_s"]}, default=str))  # fmt: skip


def prepare(flags) -> tuple:
    """Before jax starts: emulate --nodes × --gpus_per_node devices, and the --target GPU with, when the
    gpu-compile extra is missing, why the winners are not GPU-compiled. One line, exit 78, on a conflict."""
    from launch import cli, cpu_devices
    from zaya_jax.config import ConfigError
    from zaya_jax.planning import gpu_target

    if not flags.nodes:
        cli.fail("plan", "--search needs --nodes (the cluster is --nodes x --gpus_per_node devices)")
    if flags.sweep or flags.compile_scaling or flags.mesh:
        cli.fail("plan", "--search chooses the mesh itself: leave out --sweep, --compile_scaling and --mesh")
    n = flags.nodes * flags.gpus_per_node
    if flags["cpu_devices"].present and flags.cpu_devices != n:
        cli.fail("plan", f"--cpu_devices={flags.cpu_devices} but --nodes x --gpus_per_node = {n}: leave it out")
    cpu_devices.emulate(n)
    if not flags.target:
        return None, "no --target"
    try:
        target = gpu_target.get_target(flags.target)
    except ConfigError as err:
        cli.fail("plan", f"--target: {err}")
    flags.hardware = target.hardware  # the estimates and projections for the target's device
    return target, gpu_target.missing_extra(target.platform)


def main(flags, reference, target, no_gpu_compile: str | None, cluster) -> None:
    """`launch.plan --search`: plan the layouts, print the table and the winner's flags (`--out`: the JSON)."""
    from launch import cli
    from zaya_jax.config import ConfigError
    from zaya_jax.hardware import get_hardware
    from zaya_jax.planning.plan import plan

    settings = dict(hardware=flags.hardware, cluster=cluster, usable_fraction=flags.usable_memory_fraction)
    gpu_check = None
    if target is not None and not no_gpu_compile:
        from launch.plan_gpu import gpu_compiled

        def gpu_check(c):  # the dispatch the layout trains with (dropless without an expert axis), not the stand-in
            gpu_compiled(c.config, c.plan, target, flags.gpus_per_node, (c.layout.dispatch, c.layout.capacity_factor))

    else:
        print(f"note: the winners are not GPU-compiled ({no_gpu_compile}); fits = the estimate for a bf16 accelerator")
    try:
        out = run_search(
            reference,
            lambda cfg: plan(cfg, **settings, fast_compile=flags.fast_compile),
            hardware=flags.hardware,
            cluster=cluster,
            gpus_per_node=flags.gpus_per_node,
            budget=flags.search_budget,
            usable=flags.usable_memory_fraction * get_hardware(flags.hardware).memory_bytes,
            cache_dir=os.path.expanduser(flags.search_cache) if flags.search_cache else None,
            settings={**settings, "fast_compile": flags.fast_compile},
            max_dropped=flags.max_dropped,
            load_cv=flags.expert_load_cv,
            gpu_check=gpu_check,
            gpu_top=flags.search_gpu_top,
        )
    except (ConfigError, ValueError) as err:
        cli.fail("plan", str(err))
    print("\n".join(format_search(out, flags.target or flags.hardware, flags.nodes, flags.gpus_per_node)))
    if flags.out:
        with open(flags.out, "w", encoding="utf-8") as f:
            json.dump(search_record(out), f, indent=2)
