"""The GSPMD train step (`train.param_sharding` = `fsdp` | `replicated`) and the pieces every step shares:
the loss of a micro-batch, micro-batch splitting, the balancing update and the step's metrics. The ZeRO-1
step (the default, `zaya_jax.train.zero1_step`) uses the same pieces per device.

`make_train_step` returns a function `step(state, batch) -> (state, metrics)` jitted with explicit
in/out shardings and the state donated. The loss is a token mean over the *global* batch: summed
cross-entropies and token counts are accumulated over micro-batches and divided once, so the result
does not depend on the micro-batch split or the mesh (up to float reduction order).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from zaya_jax.model.layers import dtype_of
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import active_mesh, in_manual_region
from zaya_jax.train import balancing
from zaya_jax.train.loss import LossSums, chunked_objective
from zaya_jax.train.optimizer import global_norm
from zaya_jax.train.state import TrainState

BATCH_KEYS = ("input_ids", "labels", "loss_mask")


def micro_split(batch: dict, microbatches: int) -> dict:
    """[B, S] arrays → [mb, B/mb, S] (micro-batch k = rows k, k+mb, …, so each stays spread over devices)."""

    def split(x):
        x = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return {k: split(batch[k]) for k in BATCH_KEYS}


def context_blocks() -> int:
    """Blocks of the sequence dim that live on different devices under the active GSPMD mesh (its context axis)."""
    mesh = active_mesh()
    return 1 if mesh is None or in_manual_region() else int(mesh.shape["context"])


def micro_loss(graphdef, params, biases, mb: dict, config: ml_collections.ConfigDict, run_layers=None):
    """(summed objective, (LossSums, MoEStats)) of one (micro)batch; differentiate w.r.t. `params`.
    run_layers: how the layer stack runs (`Zaya.hidden_states`)."""
    model = nnx.merge(graphdef, params, biases)
    h, stats = model.hidden_states(
        sharding.constrain_batch(mb["input_ids"]), context_layout=config.mesh.context_layout, run_layers=run_layers
    )
    total, sums = chunked_objective(
        h,
        model.embed[...],
        mb["labels"],
        mb["loss_mask"],
        z_loss=config.train.z_loss,
        chunk=config.train.loss_chunk,
        blocks=context_blocks(),
        dtype=dtype_of(config.model.dtype),
        matmul=model.kernels.matmul,
    )
    return total, (sums, stats)


def loss_and_grads(graphdef, params, biases, batch: dict, config: ml_collections.ConfigDict):
    """Summed objective gradients over micro-batches. Returns (LossSums, grads (unnormalised), counts, dropped)."""
    grad_fn = jax.grad(lambda p, mb: micro_loss(graphdef, p, biases, mb, config), has_aux=True)
    if config.train.microbatches == 1:
        grads, (sums, stats) = grad_fn(params, batch)
        return sums, grads, stats.counts, stats.dropped

    def body(carry, mb):
        acc, sums_acc, counts, dropped = carry
        g, (sums, stats) = grad_fn(params, mb)
        acc = jax.tree.map(jnp.add, acc, g)
        sums_acc = jax.tree.map(jnp.add, sums_acc, sums)
        return (acc, sums_acc, counts + stats.counts, dropped + stats.dropped), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    (grads, sums, counts, dropped), _ = jax.lax.scan(
        body, (zeros, *zero_stats(config)), micro_split(batch, config.train.microbatches)
    )
    return sums, grads, counts, dropped


def zero_stats(config: ml_collections.ConfigDict) -> tuple[LossSums, jax.Array, jax.Array]:
    """Zero LossSums, counts [L, E+1] and dropped [L]: the start of a micro-batch accumulation."""
    m = config.model
    return (
        LossSums(*(jnp.zeros((), jnp.float32),) * 3),
        jnp.zeros((m.num_layers, m.num_experts + 1), jnp.int32),
        jnp.zeros((m.num_layers,), jnp.int32),
    )


def balance_and_metrics(
    biases,
    bal_state,
    sums: LossSums,
    counts: jax.Array,
    dropped: jax.Array,
    grad_norm: jax.Array,
    config: ml_collections.ConfigDict,
    lr: jax.Array | None,
):
    """The balancing-controller update from the global counts [L, E+1] and the step's metrics.
    Returns (new biases, new controller state, metrics dict of scalars / [L] / [L, E+1] arrays)."""
    bal_metrics = balancing.load_metrics(counts)
    if config.balancing.enabled:
        old = jax.tree.leaves(biases)[0]
        new_bias, bal_state, bal_metrics = balancing.update_biases(bal_state, counts, config.balancing)
        biases = jax.tree.map(lambda _: new_bias.astype(old.dtype), biases)
    n = jnp.maximum(sums.tokens, 1.0)
    metrics = {
        "loss": sums.ce / n,
        "z_loss": sums.z / n,
        "tokens": sums.tokens,
        "grad_norm": grad_norm,
        "dropped_fraction": balancing.dropped_fraction(dropped, counts),
        **bal_metrics,
    }
    if lr is not None:
        metrics["lr"] = lr
    return biases, bal_state, metrics


def train_step(
    state: TrainState,
    batch: dict,
    *,
    graphdef,
    tx: optax.GradientTransformation,
    config: ml_collections.ConfigDict,
    lr_fn: Callable | None = None,
):
    """One optimizer step on the global batch (GSPMD: `fsdp` / `replicated` parameter sharding).
    Returns (new state, metrics)."""
    sums, grads, counts, dropped = loss_and_grads(graphdef, state.params, state.biases, batch, config)
    scale = 1.0 / jnp.maximum(sums.tokens, 1.0)
    # the mean gradient's norm, once, for the metrics and the clipping (`optimizer.clip_by_global_norm`)
    grad_norm = global_norm(grads, scale)
    # × 1/n, not ÷ n: XLA fuses a scalar multiply into each consumer (the optimizer's moment updates) but
    # materialises an elementwise divide: on XLA:CPU its own pass over every gradient
    grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, state.params)
    updates, opt_state = optax.with_extra_args_support(tx).update(
        grads, state.opt_state, state.params, grad_norm=grad_norm
    )
    params = optax.apply_updates(state.params, updates)
    biases, bal_state, metrics = balance_and_metrics(
        state.biases,
        state.balancing,
        sums,
        counts,
        dropped,
        grad_norm,
        config,
        None if lr_fn is None else lr_fn(state.step),
    )
    return TrainState(state.step + 1, params, opt_state, biases, bal_state), metrics


def make_train_step(
    graphdef, tx, config: ml_collections.ConfigDict, mesh: Mesh, state_shardings: Any, lr_fn: Callable | None = None
):
    """`step(state, batch)` jitted with explicit shardings (batch over data×expert, sequence over context)."""
    batch_sharding = {k: NamedSharding(mesh, sharding.batch_spec(2)) for k in BATCH_KEYS}
    fn = jax.jit(
        lambda state, batch: train_step(state, batch, graphdef=graphdef, tx=tx, config=config, lr_fn=lr_fn),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, None),
        donate_argnums=(0,),
    )

    def step(state, batch):
        with jax.set_mesh(mesh):
            return fn(state, {k: batch[k] for k in BATCH_KEYS})

    step.jitted = fn
    return step
