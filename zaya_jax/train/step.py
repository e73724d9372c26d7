"""The sharded train step: loss + gradients over micro-batches, optimizer update, balancing update.

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

from zaya_jax.parallel import sharding
from zaya_jax.train import balancing
from zaya_jax.train.loss import LossSums, lm_loss_sums, objective
from zaya_jax.train.state import TrainState

BATCH_KEYS = ("input_ids", "labels", "loss_mask")


def _micro_split(batch: dict, microbatches: int) -> dict:
    """[B, S] arrays → [mb, B/mb, S] (micro-batch k = rows k, k+mb, …, so each stays spread over devices)."""
    def split(x):
        x = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)
    return {k: split(batch[k]) for k in BATCH_KEYS}


def loss_and_grads(graphdef, params, biases, batch: dict, config: ml_collections.ConfigDict):
    """Summed objective gradients over micro-batches. Returns (LossSums, grads (unnormalised), counts, dropped)."""
    z_loss = config.train.z_loss

    def micro_loss(p, mb):
        model = nnx.merge(graphdef, p, biases)
        out = model.forward(sharding.constrain_batch(mb["input_ids"]),
                            context_layout=config.mesh.get("context_layout", "contiguous"))
        sums = lm_loss_sums(out.logits, mb["labels"], mb["loss_mask"])
        return objective(sums, z_loss), (sums, out.stats)

    grad_fn = jax.grad(micro_loss, has_aux=True)
    if config.train.microbatches == 1:
        grads, (sums, stats) = grad_fn(params, batch)
        return sums, grads, stats.counts, stats.dropped

    def body(carry, mb):
        acc, sums_acc, counts, dropped = carry
        g, (sums, stats) = grad_fn(params, mb)
        acc = jax.tree.map(jnp.add, acc, g)
        sums_acc = jax.tree.map(jnp.add, sums_acc, sums)
        return (acc, sums_acc, counts + stats.counts, dropped + stats.dropped), None

    m = config.model
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zeros, LossSums(*(jnp.zeros((), jnp.float32),) * 3),
            jnp.zeros((m.num_layers, m.num_experts + 1), jnp.int32), jnp.zeros((m.num_layers,), jnp.int32))
    (grads, sums, counts, dropped), _ = jax.lax.scan(body, init, _micro_split(batch, config.train.microbatches))
    return sums, grads, counts, dropped


def train_step(state: TrainState, batch: dict, *, graphdef, tx: optax.GradientTransformation,
               config: ml_collections.ConfigDict, lr_fn: Callable | None = None):
    """One optimizer step on the global batch. Returns (new state, metrics dict of scalars / [L] arrays)."""
    sums, grads, counts, dropped = loss_and_grads(graphdef, state.params, state.biases, batch, config)
    n = jnp.maximum(sums.tokens, 1.0)
    grads = jax.tree.map(lambda g, p: (g / n).astype(p.dtype), grads, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    biases, bal_state = state.biases, state.balancing
    bal_metrics = balancing.load_metrics(counts)
    if config.balancing.enabled:
        old = jax.tree.leaves(state.biases)[0]
        new_bias, bal_state, bal_metrics = balancing.update_biases(bal_state, counts, config.balancing)
        biases = jax.tree.map(lambda _: new_bias.astype(old.dtype), state.biases)
    metrics = {
        "loss": sums.ce / n,
        "z_loss": sums.z / n,
        "tokens": sums.tokens,
        "grad_norm": optax.tree.norm(grads),
        "dropped_fraction": balancing.dropped_fraction(dropped, counts),
        **bal_metrics,
    }
    if lr_fn is not None:
        metrics["lr"] = lr_fn(state.step)
    return TrainState(state.step + 1, params, opt_state, biases, bal_state), metrics


def make_train_step(graphdef, tx, config: ml_collections.ConfigDict, mesh: Mesh, state_shardings: Any,
                    lr_fn: Callable | None = None):
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
