"""The per-parameter train state and its creation directly in its shardings (nothing is built on one device).

`TrainState` is the *canonical* state: parameters in `model.param_dtype` and the optax state of
`zaya_jax.train.optimizer.make_optimizer`, every leaf a global array shaped like its parameter. The `fsdp` and
`replicated` steps train on it directly; checkpoints of every mode store it (the ZeRO-1 step converts to and
from its owner layout, `zaya_jax.train.zero1.layout`), so Orbax can restore a run onto any mesh.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

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


def replicated_specs(tree: Any) -> Any:
    return jax.tree.map(lambda _: P(), tree)


def state_specs(abs_state: TrainState, mesh: Mesh, mode: str) -> TrainState:
    """PartitionSpecs of a per-parameter TrainState (`zaya_jax.parallel.sharding` rules for `mode`)."""
    return TrainState(
        step=P(),
        params=sharding.tree_specs(abs_state.params, mesh, mode, "param"),
        opt_state=sharding.tree_specs(abs_state.opt_state, mesh, mode, "opt"),
        biases=replicated_specs(abs_state.biases),
        balancing=replicated_specs(abs_state.balancing),
    )


def canonical_builder(
    config: ml_collections.ConfigDict, tx: optax.GradientTransformation
) -> Callable[[Zaya | None], TrainState]:
    """`build(model)`: the step-0 TrainState of `model`'s weights (None: a fresh init with `train.seed`)."""
    m = config.model

    def build(model: Zaya | None = None) -> TrainState:
        if model is None:
            model = Zaya(m, rngs=nnx.Rngs(params=config.train.seed))
        _, params, biases = split_model(model)
        return TrainState(
            jnp.zeros((), jnp.int32),
            params,
            tx.init(params),
            biases,
            balancing.init_balancing(jax.tree.leaves(biases)[0]),
        )

    return build


def model_graphdef(config: ml_collections.ConfigDict):
    return split_model(abstract_model(config.model))[0]


def with_shardings(abs_tree: Any, shardings: Any) -> Any:
    """Abstract leaves (`jax.ShapeDtypeStruct`) carrying their NamedShardings."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abs_tree, shardings)


def create_train_state(
    config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation, model: Zaya | None = None
):
    """Initialise (or adopt `model`'s weights) as a sharded TrainState. Returns (graphdef, state, shardings).

    The state is created inside `jit` with its output shardings, so each device materialises only its shards.
    """
    graphdef, abs_state, shardings = abstract_train_state(config, mesh, tx)
    build = canonical_builder(config, tx)
    with jax.set_mesh(mesh):
        if model is None:
            state = jax.jit(build, out_shardings=shardings)()
        else:
            state = jax.jit(lambda p, b: build(nnx.merge(graphdef, p, b)), out_shardings=shardings)(
                *split_model(model)[1:]
            )
    return graphdef, state, shardings


def abstract_train_state(config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation):
    """The TrainState as `jax.ShapeDtypeStruct` leaves carrying their `NamedSharding`s — nothing is allocated.

    For `.lower()`-ing a step (planning) or as an Orbax restore target. Returns (graphdef, abstract state,
    state shardings) with the per-parameter specs of `train.param_sharding` (ZeRO-1 runs use these for their
    checkpoints: the optimizer state spread over all devices).
    """
    abs_state = jax.eval_shape(canonical_builder(config, tx))
    specs = state_specs(abs_state, mesh, config.train.param_sharding)
    shardings = sharding.named(mesh, specs)
    return model_graphdef(config), with_shardings(abs_state, shardings), shardings
