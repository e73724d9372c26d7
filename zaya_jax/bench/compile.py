"""`--suite=compile`: the report of the planner's compile-scaling check (`zaya_jax.planning.compile_scaling`) —
train-step compile time and program size vs depth at a small width.

The decoder is a `jax.lax.scan` over stacked layers, so the compiled program — and its compile time — should
not grow with the number of layers.

Nothing is allocated: the step the config selects (`zaya_jax.train.setup.prepare_abstract`, ZeRO-1 by default)
is lowered on the abstract state and batch and compiled with `.lower(...).compile()`. The first depth is
compiled once untimed (one-time backend set-up); then each depth is a new program (the persistent cache is
off). Rows report tracing+lowering and XLA compile time separately, the number of HLO instructions of the
compiled module (every computation), and the ratio of the total to the smallest depth.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections

from zaya_jax.bench import common
from zaya_jax.parallel.mesh import AXES
from zaya_jax.planning.abstract_step import planning_config
from zaya_jax.planning.compile_scaling import compile_scaling, small_width

COLUMNS = (
    "layers",
    "hidden",
    "param_sharding",
    "devices",
    "lower_s",
    "compile_s",
    "total_s",
    "hlo_instructions",
    "ratio_vs_smallest",
)


def small_config(
    base: ml_collections.ConfigDict, num_devices: int, batch: int = 8, seq: int = 128
) -> ml_collections.ConfigDict:
    """`base` at the small width, one micro-batch of `batch` sequences per batch shard, the config's mesh over
    `num_devices`; dispatch, capacity factor and parameter sharding stay the config's."""
    cfg = small_width(base, seq_len=seq)
    return planning_config(
        cfg, batch_per_device=batch, microbatches=1, dispatch=None, capacity_factor=None, num_devices=num_devices
    )[0]


def benchmark(
    config: ml_collections.ConfigDict,
    depths: Sequence[int] = (8, 40, 80),
    *,
    warmup: bool = True,
    devices: Sequence | None = None,
    log=print,
) -> list[dict[str, Any]]:
    """`compile_scaling` of `config` (a `small_config`) on `devices` (default all) → one row per depth, smallest
    first (columns `COLUMNS`)."""
    depths = sorted(int(d) for d in depths)
    result = compile_scaling(config, tuple(depths), warmup=warmup, devices=devices)
    rows = []
    for r in result["rows"]:
        log(
            f"compile: {r['layers']} layers: lower {r['lower_s']:.1f} s + compile {r['compile_s']:.1f} s "
            f"({r['hlo_instructions']} HLO instructions)"
        )
        rows.append(
            dict(
                layers=r["layers"],
                hidden=config.model.hidden_size,
                param_sharding=config.train.param_sharding,
                devices=result["devices"],
                lower_s=r["lower_s"],
                compile_s=r["compile_s"],
                total_s=r["lower_s"] + r["compile_s"],
                hlo_instructions=r["hlo_instructions"],
            )
        )
    for r in rows:
        r["ratio_vs_smallest"] = common.ratio(r["total_s"], rows[0]["total_s"])
    return rows


def run(
    out_dir: str,
    base: ml_collections.ConfigDict,
    depths: Sequence[int] = (8, 40, 80),
    *,
    batch: int = 8,
    seq: int = 128,
    warmup: bool = True,
    devices: Sequence | None = None,
    command: str | None = None,
) -> list[dict[str, Any]]:
    """Measure `base` at the small width (`small_config`) on `devices` (default all) and write compile.csv / .md."""
    devices = list(devices if devices is not None else jax.devices())
    config = small_config(base, len(devices), batch=batch, seq=seq)
    rows = benchmark(config, depths, warmup=warmup, devices=devices, log=common.say)
    m, t = config.model, config.train
    setup = (
        f"hidden {m.hidden_size}, {m.num_experts} experts of width {m.moe_intermediate_size}, vocab {m.vocab_size} "
        f"(`compile_scaling.SMALL_WIDTH`); global batch {t.global_batch_size} × {t.seq_len} tokens, one micro-batch, "
        f"mesh {','.join(f'{a}:{config.mesh[a]}' for a in AXES)}; dispatch {m.dispatch}, the config's train step "
        "(loss + grads + optimizer + balancing update)\n\n" + __doc__.split("\n\n", 2)[2]
    )
    return common.report(
        out_dir,
        "compile",
        rows,
        title="Train-step compile time vs depth",
        table_columns=list(COLUMNS),
        csv_columns=COLUMNS,
        sections=[("Setup", setup)],
        command=command,
    )
