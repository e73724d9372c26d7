"""The train state and its creation directly in its shardings (nothing is built on one device first)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zaya_jax.model.layers import BalancingBias
from zaya_jax.model.zaya import Zaya, abstract_model
from zaya_jax.parallel import sharding
from zaya_jax.train import balancing


class TrainState(NamedTuple):
    step: jax.Array  # [] int32 optimizer steps taken
    params: Any  # nnx.State of nnx.Param
    opt_state: Any  # optax state
    biases: Any  # nnx.State of BalancingBias, [L, E+1] fp32
    balancing: Any  # balancing.BalancingState


def split_model(model: Zaya):
    """(graphdef, params, biases) — the two variable kinds a train step treats differently."""
    return nnx.split(model, nnx.Param, BalancingBias)


def _state_specs(abs_state: TrainState, mesh: Mesh, mode: str) -> TrainState:
    replicated = lambda tree: jax.tree.map(lambda _: P(), tree)  # noqa: E731
    return TrainState(
        step=P(),
        params=sharding.tree_specs(abs_state.params, mesh, mode, "param"),
        opt_state=sharding.tree_specs(abs_state.opt_state, mesh, mode, "opt"),
        biases=replicated(abs_state.biases),
        balancing=replicated(abs_state.balancing),
    )


def create_train_state(config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation,
                       model: Zaya | None = None):
    """Initialise (or adopt `model`'s weights) as a sharded TrainState.

    Returns (graphdef, state, state_shardings). Parameters are created inside `jit` with their output
    shardings, so each device only materialises its own shards.
    """
    m = config.model
    graphdef, abs_params, abs_biases = split_model(abstract_model(m))

    def build(params, biases):
        bias_values = jax.tree.leaves(biases)[0]
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), biases,
                          balancing.init_balancing(bias_values))

    def fresh():
        _, params, biases = split_model(Zaya(m, rngs=nnx.Rngs(params=config.train.seed)))
        return build(params, biases)

    abs_state = jax.eval_shape(fresh)
    specs = _state_specs(abs_state, mesh, config.train.param_sharding)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    with jax.set_mesh(mesh):
        if model is None:
            state = jax.jit(fresh, out_shardings=shardings)()
        else:
            _, params, biases = split_model(model)
            state = jax.jit(build, out_shardings=shardings)(params, biases)
    return graphdef, state, shardings


def abstract_train_state(config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation):
    """The TrainState as `jax.ShapeDtypeStruct` leaves carrying their `NamedSharding`s — nothing is allocated.

    Same structure, shapes, dtypes and shardings as `create_train_state` produces, for `.lower()`-ing the
    train step (memory / FLOP planning) or as an Orbax restore target. Returns (graphdef, abstract state,
    state shardings).
    """
    m = config.model
    graphdef, _, _ = split_model(abstract_model(m))

    def fresh():
        _, params, biases = split_model(Zaya(m, rngs=nnx.Rngs(params=config.train.seed)))
        bias_values = jax.tree.leaves(biases)[0]
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), biases,
                          balancing.init_balancing(bias_values))

    abs_state = jax.eval_shape(fresh)
    specs = _state_specs(abs_state, mesh, config.train.param_sharding)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    abs_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abs_state, shardings)
    return graphdef, abs_state, shardings
