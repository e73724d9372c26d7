"""The GSPMD train step (`train.param_sharding` = `fsdp` | `replicated`): XLA partitions one global program
by the parameter and batch shardings. The micro-batch loop and the loss (`zaya_jax.train.microbatch`) and the
closing balancing update and metrics (`zaya_jax.train.step_metrics`) are shared with the ZeRO-1 step (the
default, `zaya_jax.train.zero1`).

`make_train_step` returns a function `step(state, batch) -> (state, metrics)` jitted with explicit
in/out shardings and the state donated.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from zaya_jax.parallel import sharding
from zaya_jax.train import microbatch
from zaya_jax.train.microbatch import BATCH_KEYS, micro_loss
from zaya_jax.train.optimizer import global_norm
from zaya_jax.train.state import TrainState
from zaya_jax.train.step_metrics import balance_and_metrics
from zaya_jax.train.step_wrapper import step_on_mesh


def loss_and_grads(graphdef, params, biases, batch: dict, config: ml_collections.ConfigDict):
    """The summed objective's gradients (fp32, parameter-shaped, not yet divided by the token count) over the
    micro-batches of `batch`, and the step's Totals (`microbatch.accumulate`)."""
    grad_fn = jax.grad(lambda p, mb: micro_loss(graphdef, p, biases, mb, config), has_aux=True)

    def add_grads(acc, mb):
        grads, aux = grad_fn(params, mb)
        return microbatch.add_fp32(acc, grads), aux

    return microbatch.accumulate(add_grads, microbatch.fp32_zeros(params), batch, config)


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
    grads, totals = loss_and_grads(graphdef, state.params, state.biases, batch, config)
    scale = 1.0 / jnp.maximum(totals.loss.tokens, 1.0)
    # the mean gradient's norm, once, for the metrics and the clipping (`optimizer.clip_by_global_norm`)
    grad_norm = global_norm(grads, scale)
    # × 1/n, not ÷ n: XLA fuses a scalar multiply into each consumer (the optimizer's moment updates) but
    # materialises an elementwise divide: on XLA:CPU its own pass over every gradient
    grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, state.params)
    updates, opt_state = optax.with_extra_args_support(tx).update(
        grads, state.opt_state, state.params, grad_norm=grad_norm
    )
    params = optax.apply_updates(state.params, updates)
    lr = None if lr_fn is None else lr_fn(state.step)
    biases, bal_state, metrics = balance_and_metrics(
        state.biases, state.balancing, totals, grad_norm, config, lr, state.step
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
    return step_on_mesh(fn, mesh)
