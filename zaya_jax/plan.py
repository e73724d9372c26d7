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
from jax.sharding import NamedSharding

from zaya_jax import cluster as cluster_lib
from zaya_jax import hlo_stats, hlo_text, overlap, projection, sizing
from zaya_jax.config import REMAT_POLICIES, choice_table, validate_mesh
from zaya_jax.kernels.attention import attention_chunks
from zaya_jax.model.flops import active_matmul_params, train_flops_per_token
from zaya_jax.model.moe import capacity
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES, BATCH_AXES, make_mesh, parse_mesh_spec, resolve_mesh_shape
from zaya_jax.train.schedule import check_layout
from zaya_jax.train.setup import prepare_abstract
from zaya_jax.train.step import BATCH_KEYS

# XLA options that only shorten LLVM code generation; HLO passes, buffer assignment and cost analysis are
# unchanged (the planner never runs the program).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
REMAT_AUTO_ORDER = ("none", "dots", "full")


def parse_mesh(text: str) -> dict[str, int]:
    """`"data:8"` / `"data:2,expert:4"` → sizes for all mesh axes (unnamed axes = 1); ValueError on bad input."""
    return parse_mesh_spec(text)


def planning_config(
    config: ml_collections.ConfigDict,
    *,
    mesh: dict[str, int] | None = None,
    seq_len: int | None = None,
    batch_per_device: int = 1,
    microbatches: int | None = None,
    remat: str | None = None,
    param_sharding: str | None = None,
    dispatch: str | None = "auto",
    capacity_factor: float | None = None,
    num_devices: int | None = None,
) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A copy of `config` set up for planning, and notes on what was changed.

    The global batch is `batch_per_device` sequences per batch shard (data × expert) per micro-batch.
    dispatch="auto": 'ep' (per-device capacity buffers, sized like a dropless grouped GEMM at cf = 1) unless
    the config uses 'dense'; 'capacity' computes one *global* capacity that GSPMD partitions with
    all-gathers / all-reduces of the whole buffer, and XLA:CPU lowers `ragged_dot` to a dense masked dot (E×).
    """
    cfg, notes = copy.deepcopy(config), []
    with cfg.unlocked():
        m, t = cfg.model, cfg.train
        if mesh is not None:
            for axis in AXES:
                cfg.mesh[axis] = int(mesh.get(axis, 1))
        sizes = resolve_mesh_shape(cfg.mesh, num_devices or jax.device_count())
        for axis, size in sizes.items():
            cfg.mesh[axis] = size
        if seq_len:
            t.seq_len = int(seq_len)
        if microbatches:
            t.microbatches = int(microbatches)
        t.global_batch_size = batch_per_device * math.prod(sizes[a] for a in BATCH_AXES) * t.microbatches
        t.batch_ramp = ()
        if remat:
            m.remat = remat
        if param_sharding:
            t.param_sharding = param_sharding
        if dispatch == "auto":
            dispatch = "dense" if m.dispatch == "dense" else "ep"
        if dispatch and dispatch != m.dispatch:
            notes.append(f"dispatch {m.dispatch!r} -> {dispatch!r} for planning")
            m.dispatch = dispatch
        if capacity_factor and capacity_factor != m.capacity_factor:
            notes.append(f"capacity_factor {m.capacity_factor} -> {capacity_factor} for planning")
            m.capacity_factor = float(capacity_factor)
    validate_mesh(cfg)  # e.g. the sequence must split into equal context-parallel chunks
    check_layout(cfg, sizes)
    return cfg, notes


def abstract_batch(config: ml_collections.ConfigDict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    shape = (config.train.global_batch_size, config.train.seq_len)
    spec = NamedSharding(mesh, sharding.batch_spec(2))
    dtypes = {"input_ids": jnp.int32, "labels": jnp.int32, "loss_mask": jnp.float32}
    return {k: jax.ShapeDtypeStruct(shape, dtypes[k], sharding=spec) for k in BATCH_KEYS}


def lower_train_step(config: ml_collections.ConfigDict, devices: list | None = None, platform: str | None = None):
    """The train step of `config` (`zaya_jax.train.setup.prepare_abstract`) lowered on abstract state and batch →
    (lowered, mesh, the abstract `Training`). platform: lower for that platform ("rocm", "cuda") instead of the
    devices' own (a program that cannot run here, `zaya_jax.bench.lowering`)."""
    devices = list(devices if devices is not None else jax.devices())
    need = math.prod(int(config.mesh[a]) for a in AXES)
    if need > len(devices):
        raise ValueError(
            f"mesh {dict(config.mesh)} needs {need} devices, {len(devices)} available "
            "(emulate more with --cpu_devices=N)"
        )
    mesh = make_mesh(config, devices[:need])
    training = prepare_abstract(config, mesh)
    with jax.set_mesh(mesh):
        traced = training.step.jitted.trace(training.state, abstract_batch(config, mesh))
        lowered = traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
    return lowered, mesh, training


def sharded_bytes(tree: Any) -> float:
    """Per-device bytes of abstract leaves carrying shardings (the largest shard of each leaf)."""
    total = 0.0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def effective_capacity_factor(config: ml_collections.ConfigDict, num_devices: int) -> float:
    """Expert-GEMM rows XLA computes per routed token: E·C / T (1.0 = exactly the top-1 active FLOPs)."""
    m, t = config.model, config.train
    tokens = t.global_batch_size // t.microbatches * t.seq_len
    if m.dispatch == "dense":  # (planned dropless runs `ep` at cf 1, see `prepare_config`)
        return float(m.num_experts)
    local = tokens // num_devices if m.dispatch == "ep" else tokens
    return m.num_experts * capacity(local, m.num_experts, m.capacity_factor) / local


def analytic_flops(config: ml_collections.ConfigDict, num_devices: int, params: Any) -> dict[str, float]:
    """Global FLOPs per optimizer step: `model` = 6·N_active·T + causal attention (MFU convention) and the
    extras XLA executes on top of it (each listed; `hardware` = their sum)."""
    m, t = config.model, config.train
    seq, tokens = t.seq_len, t.global_batch_size * t.seq_len
    nl, h, i = m.num_layers, m.hidden_size, m.moe_intermediate_size
    cf = effective_capacity_factor(config, num_devices)
    attn_square = 4 * nl * m.num_q_heads * m.head_dim * seq  # QK + AV over the full S×S square
    # share of the square XLA computes: in the zigzag context layout the 2n+1 causally needed of the 4n²
    # (S/2n)² blocks per device (`zaya_jax.model.cca_context`); otherwise without context parallelism the
    # (n+1)/2n of n query blocks (`kernels.attention.causal_attention`), with a contiguous context split all of
    # it (masked)
    n_ctx = int(config.mesh.context)
    zigzag = n_ctx > 1 and config.mesh.context_layout == "zigzag"
    chunks = attention_chunks(seq, int(m.attention_chunk)) if n_ctx == 1 else 1
    square = (2 * n_ctx + 1) / (4 * n_ctx) if zigzag else (chunks + 1) / (2 * chunks)
    attn_fwd_full = square * attn_square
    expert_fwd = 2 * nl * 3 * h * i
    layers_fwd = 2 * (active_matmul_params(m) - m.vocab_size * h) + expert_fwd * (cf - 1) + attn_fwd_full
    recompute = choice_table(
        REMAT_POLICIES,
        {
            "none": 0.0,
            "dots": 0.0,
            "full": layers_fwd,
            "dots_no_batch": attn_fwd_full
            + expert_fwd * cf
            + 2 * nl * m.cca_time1 * (m.num_q_heads + m.num_kv_heads) * m.head_dim**2,
        },
    )[m.remat]
    out = {
        "model": train_flops_per_token(m, seq) * tokens,
        "attention_masked_half": 3 * (square - 0.5) * attn_square * tokens,
        "expert_capacity_padding": 3 * expert_fwd * (cf - 1) * tokens,
        "remat_recompute": recompute * tokens,
        "muon_newton_schulz": projection.ns_flops(params, config),
    }
    out["hardware"] = sum(out.values())
    return out


def _cost(compiled) -> dict[str, float]:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {k: float(v) for k, v in (cost or {}).items() if k in ("flops", "bytes accessed", "transcendentals")}


def _memory(compiled) -> dict[str, float]:
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
    hw: sizing.Hardware,
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
    hw = sizing.get_hardware(hardware)
    t0 = time.perf_counter()
    lowered, mesh, training = lower_train_step(config, devices)
    abs_state, params = training.state, training.checkpoint_target.params  # run state; per-parameter shapes
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options=FAST_COMPILE if fast_compile else None)
    t2 = time.perf_counter()
    n, t = mesh.size, config.train
    mem, cost = _memory(compiled), _cost(compiled)
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


def small_width(config: ml_collections.ConfigDict, seq_len: int = 128) -> ml_collections.ConfigDict:
    """Same depth and structure, tiny width (for compile-time measurements)."""
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
        cfg.model.update(
            dict(
                hidden_size=128,
                head_dim=32,
                num_q_heads=4,
                num_kv_heads=2,
                moe_intermediate_size=128,
                router_hidden_size=32,
                vocab_size=512,
                num_experts=max(4, int(cfg.mesh.expert)),
            )
        )
        cfg.train.seq_len = seq_len
    return cfg


def _with_depth(config: ml_collections.ConfigDict, depth: int) -> ml_collections.ConfigDict:
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
        cfg.model.num_layers = int(depth)
    return cfg


def compile_scaling(
    config: ml_collections.ConfigDict,
    depths: tuple[int, ...] = (8, 40, 80),
    *,
    compile: bool = True,
    fast_compile: bool = False,
    warmup: bool = True,
    devices: list | None = None,
) -> dict:
    """Lower (and compile) the train step at each depth; compile cost must not grow with depth (scanned layers).

    Returns {'rows': [{layers, lower_s, stablehlo_chars[, compile_s, hlo_chars, hlo_instructions]}],
    'ratios': last depth / first depth for each measured quantity}.
    """
    rows = []
    if compile and warmup:  # the first compile of a process pays one-time backend set-up: keep it out of the rows
        lower_train_step(_with_depth(config, depths[0]), devices)[0].compile(
            compiler_options=FAST_COMPILE if fast_compile else None
        )
    for depth in depths:
        t0 = time.perf_counter()
        lowered, mesh, _ = lower_train_step(_with_depth(config, depth), devices)
        row = {"layers": int(depth), "lower_s": time.perf_counter() - t0, "stablehlo_chars": len(lowered.as_text())}
        if compile:
            t0 = time.perf_counter()
            compiled = lowered.compile(compiler_options=FAST_COMPILE if fast_compile else None)
            text = compiled.as_text()
            row.update(
                compile_s=time.perf_counter() - t0,
                hlo_chars=len(text),
                hlo_instructions=hlo_stats.analyze(text, mesh.size).num_instructions,
            )
        rows.append(row)
    keys = [k for k in rows[0] if k != "layers"]
    return {
        "rows": rows,
        "ratios": {k: rows[-1][k] / rows[0][k] for k in keys},
        "depths": list(depths),
        "fast_compile": fast_compile,
    }
