"""Compile time of the train step vs depth (the decoder is a `jax.lax.scan` over stacked layers, so the
compiled program — and its compile time — should not grow with the number of layers).

Nothing is allocated: the step is lowered on `abstract_train_state` (ShapeDtypeStructs with shardings)
and compiled with `.lower(...).compile()`. Each depth is a new program (no compilation-cache hits:
the persistent cache is not enabled here). Rows report tracing+lowering and XLA compile time separately,
the number of HLO instructions of the compiled module, and the ratio of the total to the smallest depth.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import ml_collections
import optax

from zaya_jax.bench import common
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train.microbatch import BATCH_KEYS
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import abstract_train_state
from zaya_jax.train.step import make_train_step

COLUMNS = (
    "layers",
    "hidden",
    "optimizer",
    "devices",
    "lower_s",
    "compile_s",
    "total_s",
    "hlo_instructions",
    "ratio_vs_smallest",
)
SMALL_WIDTH = dict(
    vocab_size=1024,
    hidden_size=128,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=32,
    num_experts=8,
    moe_intermediate_size=128,
    router_hidden_size=32,
    max_position_embeddings=1024,
)


def small_config(
    base: ml_collections.ConfigDict, layers: int, batch: int = 8, seq: int = 128
) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(base.to_dict())
    c.model.update(SMALL_WIDTH)
    c.model.num_layers = layers
    c.train.global_batch_size, c.train.seq_len, c.train.microbatches = batch, seq, 1
    return c


def compile_time(
    config: ml_collections.ConfigDict, optimizer: str = "muon", devices: Sequence | None = None
) -> dict[str, Any]:
    """Lower + compile the jitted train step for `config` without allocating the state."""
    mesh = make_mesh(config, list(devices or jax.devices()[:1]))
    tx = make_optimizer(config) if optimizer == "muon" else optax.adamw(1e-3)
    t0 = time.perf_counter()
    graphdef, abs_state, shardings = abstract_train_state(config, mesh, tx)
    step = make_train_step(graphdef, tx, config, mesh, shardings)
    b, s = config.train.global_batch_size, config.train.seq_len
    spec = jax.sharding.NamedSharding(mesh, sharding.batch_spec(2))
    batch = {
        k: jax.ShapeDtypeStruct((b, s), "float32" if k == "loss_mask" else "int32", sharding=spec) for k in BATCH_KEYS
    }
    with jax.set_mesh(mesh):
        lowered = step.jitted.lower(abs_state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    hlo = sum(1 for line in compiled.as_text().splitlines() if " = " in line)
    return dict(
        layers=config.model.num_layers,
        hidden=config.model.hidden_size,
        optimizer=optimizer,
        devices=mesh.size,
        lower_s=t1 - t0,
        compile_s=t2 - t1,
        total_s=t2 - t0,
        hlo_instructions=hlo,
    )


def benchmark(
    base: ml_collections.ConfigDict,
    depths: Sequence[int] = (8, 40, 80),
    optimizer: str = "muon",
    log=print,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    rows = []
    for depth in depths:
        row = compile_time(small_config(base, depth, **kwargs), optimizer)
        log(
            f"compile: {depth} layers: lower {row['lower_s']:.1f} s + compile {row['compile_s']:.1f} s "
            f"({row['hlo_instructions']} HLO instructions)"
        )
        rows.append(row)
    smallest = min(rows, key=lambda r: r["layers"])["total_s"]
    for r in rows:
        r["ratio_vs_smallest"] = common.ratio(r["total_s"], smallest)
    return rows


def run(
    out_dir: str, base: ml_collections.ConfigDict, *, command: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    rows = benchmark(base, log=common.say, **kwargs)
    w = SMALL_WIDTH
    setup = (
        f"hidden {w['hidden_size']}, {w['num_experts']} experts of width {w['moe_intermediate_size']}, "
        f"vocab {w['vocab_size']}; train step = loss + grads + optimizer + balancing update\n\n"
        + __doc__.split("\n\n", 1)[1]
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
