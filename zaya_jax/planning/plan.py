"""Plan a training run without hardware: compile the real train step from abstract shapes on an (emulated)
CPU mesh and report per-device memory, FLOPs, collective bytes and a projected step time on the paper's cluster.

Nothing is allocated: the train state is `jax.eval_shape`d (`train.setup.prepare_abstract`), the batch
is `jax.ShapeDtypeStruct`s with their shardings, and the jitted train step of `train.param_sharding` is
`.lower(...).compile()`d. Sources of each number:

* memory — `compiled.memory_analysis()` (arguments, outputs, donated aliases, temporaries) next to
  analytic per-device bytes of parameters and optimizer state from the sharded shapes;
* FLOPs — XLA runs one SPMD program per device, so `cost_analysis()` and the HLO describe **one device**;
  per-step totals are per-device × device count (every partition runs the same program on equal shards).
  `cost_analysis()` also counts every while-loop body **once** (the layer scan = one layer), so the
  planner takes dot FLOPs from the HLO text with loop trip counts applied (`hlo_stats`) and compares them
  with the analytic `6·N_active·tokens + attention` (`model.flops`) plus explicit, separately listed
  extras XLA really executes: the masked part of attention (query blocks or not), capacity padding, remat recompute
  and Muon's Newton–Schulz iterations;
* collectives — operand bytes of every collective in the HLO, × loop trip counts (a `conditional` counts
  its most expensive branch), with their device groups; the ZeRO-1 minimum they are compared with is
  analytic (`projection.zero1_minimum`);
* projection — step time = compute (executed dot FLOPs at the bf16 peak) + memory-bound passes (an
  analytic HBM byte count, `projection.hbm_traffic`) + every collective priced on the paper's cluster
  (`cluster.Cluster`: xGMI nodes, one NIC per GPU, rails-only, hierarchical collectives, α–β per stage),
  nothing overlapped; projected MFU = model FLOPs / (step time · peak). The overlapped projection takes
  off what of each collective can hide under the compute of the loop body it is issued in (`overlap`).

XLA:CPU differs from an accelerator backend: it upcasts bf16 dots to f32, fuses less, and materialises the
attention logits. Its program traffic (`hlo_stats.hbm_bytes`) is therefore only an upper bound (printed as
such); memory figures are estimates for the target accelerator.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.hardware import Hardware, get_hardware
from zaya_jax.planning import cluster as cluster_lib
from zaya_jax.planning import hlo_stats, hlo_text, overlap, projection
from zaya_jax.planning.abstract_step import FAST_COMPILE, ep_ragged_upper_bound, lower_train_step
from zaya_jax.planning.flops import analytic_flops, effective_capacity_factor

REMAT_AUTO_ORDER = ("none", "dots", "full")


def sharded_bytes(tree: Any) -> float:
    """Per-device bytes of abstract leaves carrying shardings (the largest shard of each leaf)."""
    total = 0.0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def _cost(compiled) -> dict[str, float]:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {k: float(v) for k, v in (cost or {}).items() if k in ("flops", "bytes accessed", "transcendentals")}


def compiled_memory(compiled) -> dict[str, float]:
    stats = compiled.memory_analysis()
    names = ("argument", "output", "alias", "temp", "generated_code")
    out = {n: float(getattr(stats, f"{n}_size_in_bytes", 0) or 0) for n in names}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def _projections(
    config: ml_collections.ConfigDict,
    stats: hlo_stats.HloStats,
    analytic: dict[str, float],
    params: Any,
    n: int,
    hw: Hardware,
    cluster: cluster_lib.Cluster,
) -> dict:
    """The compiled step projected on `cluster` (`projected`), the same layout at the ZeRO-1 minimum with
    balanced Newton–Schulz and analytic FLOPs (`ideal`), the analytic HBM bytes and collective minimum."""
    t, ns = config.train, analytic["muon_newton_schulz"]
    tokens, model = t.global_batch_size * t.seq_len / n, analytic["model"] / n
    optimizer_flops = stats.dot_flops - stats.dot_flops_by_tag.get("autodiff", 0.0)
    cf = effective_capacity_factor(config, n)
    ridge = hw.peak_bf16_flops / (hw.hbm_bandwidth * cluster.hbm_efficiency)
    traffic = projection.hbm_traffic(config, params, n, cf, optimizer_flops / ns if ns else 0.0, ridge)
    ideal_traffic = projection.hbm_traffic(config, params, n, cf, 1.0 / n, ridge)
    minimum, minimum_time = projection.zero1_minimum(config, params, n, cluster)
    priced = cluster_lib.price(cluster, stats.collective_ops)
    projected = projection.project(
        executed_flops=stats.dot_flops,
        model_flops=model,
        tokens=tokens,
        hbm_bytes=traffic["total"],
        collectives=priced,
        hw=hw,
        cluster=cluster,
    )
    hidden = overlap.bodies(stats, cluster, hw.peak_bf16_flops)
    overlapped = overlap.overlapped(projected, hidden, model, hw.peak_bf16_flops)
    ideal = projection.project(
        executed_flops=analytic["hardware"] / n,
        model_flops=model,
        tokens=tokens,
        hbm_bytes=ideal_traffic["total"],
        collectives=minimum_time,
        hw=hw,
        cluster=cluster,
    )
    return {
        "hardware": hw.name,
        "peak_flops": hw.peak_bf16_flops,
        "hbm_bandwidth": hw.hbm_bandwidth,
        "cluster": dataclasses.asdict(cluster),
        "assumptions": cluster.describe() + projection.describe(),
        "hbm_bytes": traffic,
        "hbm_bytes_ideal": ideal_traffic,
        "xla_cpu_hbm_bytes_upper_bound": stats.hbm_bytes,
        "xla_cpu_memory_s_upper_bound": stats.hbm_bytes / (hw.hbm_bandwidth * cluster.hbm_efficiency),
        "zero1_minimum_wire_bytes": minimum,
        "projected": projected,
        "overlapped": overlapped,
        "overlap_assumptions": overlap.describe(),
        "ideal": ideal,
    }


def _over_minimum(wire: float, minimum: float) -> float:
    """Compiled / minimum collective bytes; one device needs none: 1.0 if it moves none either, else inf."""
    if minimum:
        return wire / minimum
    return 1.0 if not wire else math.inf


def plan(
    config: ml_collections.ConfigDict,
    *,
    hardware: str = "mi300x",
    cluster: cluster_lib.Cluster | None = None,
    usable_fraction: float = 0.95,
    devices: list | None = None,
    fast_compile: bool = True,
) -> dict:
    """Compile the train step of `config` (set up with `planning_config`) and report; see the module doc.

    Returns a JSON-serialisable dict: setup, memory (per device), flops, collectives, projection, summary
    (the five headline numbers), fits.
    """
    hw = get_hardware(hardware)
    asked = config.model.dispatch
    config = ep_ragged_upper_bound(config)
    t0 = time.perf_counter()
    lowered, mesh, training = lower_train_step(config, devices)
    abs_state, params = training.state, training.checkpoint_target.params  # run state; per-parameter shapes
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options=FAST_COMPILE if fast_compile else None)
    t2 = time.perf_counter()
    n, t = mesh.size, config.train
    mem, cost = compiled_memory(compiled), _cost(compiled)
    text = compiled.as_text()
    stats = hlo_stats.analyze(text, n)
    tokens = t.global_batch_size * t.seq_len
    opt = abs_state.groups if training.zero1 is not None else abs_state.opt_state
    params_b, opt_b = sharded_bytes(abs_state.params), sharded_bytes(opt)
    mem["cpu_fp32_param_copies"] = hlo_text.widened_parameter_bytes(text)
    mem["peak_without_cpu_copies"] = mem["peak"] - mem["cpu_fp32_param_copies"]
    memory = {
        **mem,
        "params": params_b,
        "opt_state": opt_b,
        "other_state": sharded_bytes((abs_state.step, abs_state.biases, abs_state.balancing)),
        # for reference: all gradients at once in the dtype forward/backward read the parameters in
        "gradients_unsharded": sum(
            math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(abs_state.params)
        ),
        "capacity": hw.memory_bytes,
        "usable": usable_fraction * hw.memory_bytes,
    }
    analytic = analytic_flops(config, n, params)
    extras = analytic["attention_masked_half"] + analytic["expert_capacity_padding"] + analytic["remat_recompute"]
    xla_total = stats.dot_flops * n
    xla_grad = stats.dot_flops_by_tag.get("autodiff", 0.0) * n
    flops = {
        "xla_cost_analysis_per_device": cost.get("flops", 0.0),
        "xla_cost_analysis_loop_corrected_per_device": cost.get("flops", 0.0) + stats.dot_flops - stats.dot_flops_once,
        "hlo_dot_per_device": stats.dot_flops,
        "hlo_dot_total": xla_total,
        "hlo_dot_forward_backward": xla_grad,
        "hlo_dot_optimizer": xla_total - xla_grad,
        "analytic": analytic,
        "xla_over_analytic_hardware": xla_total / analytic["hardware"],
        "forward_backward_over_analytic": xla_grad / (analytic["model"] + extras),
        "optimizer_over_analytic_ns": (xla_total - xla_grad) / max(analytic["muon_newton_schulz"], 1.0),
        "xla_model": xla_grad - extras,
    }
    flops["xla_model_over_analytic_model"] = flops["xla_model"] / analytic["model"]
    proj = _projections(config, stats, analytic, params, n, hw, cluster or cluster_lib.Cluster())
    proj["xla_cost_bytes_accessed_per_device"] = cost.get("bytes accessed", 0.0)
    summary = {
        "executed_over_analytic_hardware_flops": flops["xla_over_analytic_hardware"],
        "optimizer_over_newton_schulz_flops": flops["optimizer_over_analytic_ns"],
        "collective_wire_over_zero1_minimum": _over_minimum(
            stats.wire_bytes, proj["zero1_minimum_wire_bytes"]["total"]
        ),
        "projected_mfu": proj["projected"]["mfu"],
        "projected_mfu_overlapped": proj["overlapped"]["mfu"],
    }
    return {
        "setup": {
            "mesh": dict(mesh.shape),
            "devices": n,
            "seq_len": t.seq_len,
            "global_batch": t.global_batch_size,
            "microbatches": t.microbatches,
            "tokens_per_step": tokens,
            "remat": config.model.remat,
            "param_sharding": t.param_sharding,
            "dispatch": config.model.dispatch,
            "dispatch_planned_for": asked,
            "capacity_factor": config.model.capacity_factor,
            "num_layers": config.model.num_layers,
            "dtype": config.model.dtype,
            "param_dtype": config.model.param_dtype,
            "grad_reduce_dtype": projection.grad_reduce_dtype(config),
            "lower_s": t1 - t0,
            "compile_s": t2 - t1,
            "fast_compile": fast_compile,
            "hlo_chars": len(text),
            "hlo_instructions": stats.num_instructions,
            "loop_trip_counts": sorted(stats.trip_counts.values()),
            "unknown_trip_counts": stats.unknown_trip_counts,
        },
        "memory": memory,
        "flops": flops,
        "projection": proj,
        "summary": summary,
        "collectives": {k: vars(v) for k, v in sorted(stats.collectives.items())},
        "collective_bytes_per_device": stats.collective_bytes,
        "collective_wire_bytes_per_device": stats.wire_bytes,
        "fits": mem["peak"] <= memory["usable"],
    }


def plan_auto_remat(config: ml_collections.ConfigDict, order: tuple[str, ...] = REMAT_AUTO_ORDER, **kwargs) -> dict:
    """Plan with each remat policy in `order` until one fits; returns that plan (or the last) with
    `remat_auto` = {'chosen': policy or None, 'attempts': [{remat, peak, fits}, ...]}."""
    attempts, result = [], {}
    for policy in order:
        cfg = copy.deepcopy(config)
        with cfg.unlocked():
            cfg.model.remat = policy
        result = plan(cfg, **kwargs)
        attempts.append(
            {
                "remat": policy,
                "peak": result["memory"]["peak"],
                "fits": result["fits"],
                "compile_s": result["setup"]["compile_s"],
            }
        )
        if result["fits"]:
            break
    result["remat_auto"] = {"chosen": attempts[-1]["remat"] if attempts[-1]["fits"] else None, "attempts": attempts}
    return result
