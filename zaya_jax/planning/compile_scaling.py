"""Compile cost of the train step against depth: the decoder scans its stacked layers, so the lowered and
compiled programs (and their compile time) must not grow with the number of layers (`launch.plan
--compile_scaling`, docs/planner.md; `launch.bench --suite=compile` reports the same measurement).

The step is the one the config selects (`zaya_jax.train.setup.prepare_abstract`: ZeRO-1 by default), lowered
on the abstract state and batch of `zaya_jax.planning.abstract_step` — nothing is allocated. Each depth is a
new program; callers disable the persistent compilation cache so no depth is a cache hit.
"""

from __future__ import annotations

import copy
import time

import ml_collections

from zaya_jax.planning import hlo_stats
from zaya_jax.planning.abstract_step import FAST_COMPILE, lower_train_step

# The one small width of compile-time measurements: depth and structure stay the config's (num_experts is at
# least the expert-axis size, so the experts still split over it).
SMALL_WIDTH = dict(
    hidden_size=128,
    head_dim=32,
    num_q_heads=4,
    num_kv_heads=2,
    moe_intermediate_size=128,
    router_hidden_size=32,
    vocab_size=512,
    num_experts=4,
)


def small_width(config: ml_collections.ConfigDict, seq_len: int = 128) -> ml_collections.ConfigDict:
    """Same depth and structure, the width of `SMALL_WIDTH` and sequence length `seq_len`."""
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
        cfg.model.update(SMALL_WIDTH)
        cfg.model.num_experts = max(SMALL_WIDTH["num_experts"], int(cfg.mesh.expert))
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

    `config` has a resolved mesh (`abstract_step.planning_config`). warmup: compile the first depth once
    before measuring (the first compile of a process pays one-time backend set-up).
    Returns {'rows': [{layers, lower_s, stablehlo_chars[, compile_s, hlo_chars, hlo_instructions]}],
    'ratios': last depth / first depth for each measured quantity, 'depths', 'devices', 'fast_compile'}.
    lower_s is tracing + lowering (state and step built from the config included); hlo_instructions counts the
    instructions of every computation of the compiled module (`hlo_stats.analyze`).
    """
    options = FAST_COMPILE if fast_compile else None
    if compile and warmup:
        lower_train_step(_with_depth(config, depths[0]), devices)[0].compile(compiler_options=options)
    rows, num_devices = [], 0
    for depth in depths:
        t0 = time.perf_counter()
        lowered, mesh, _ = lower_train_step(_with_depth(config, depth), devices)
        num_devices = mesh.size
        row = {"layers": int(depth), "lower_s": time.perf_counter() - t0, "stablehlo_chars": len(lowered.as_text())}
        if compile:
            t0 = time.perf_counter()
            compiled = lowered.compile(compiler_options=options)
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
        "devices": num_devices,
        "fast_compile": fast_compile,
    }
