"""ZeRO-1 state and its checkpoint form (arXiv 2511.17127 §2; docs/parallelism.md): the arrays the step carries,
split over the devices by the owner layouts of `zaya_jax.train.zero1.layout`, and their conversion to and from the
per-parameter `TrainState` that checkpoints hold.

    Zero1State.params   nnx.State in the compute dtype (`model.dtype`): what forward/backward read, replicated
                        (routed experts split over `expert` under expert parallelism)
    Zero1State.groups   per group, global arrays split over the group's devices:
                          master_slots, momentum  [O, n·s, S] fp32   Muon matrices in owner slots
                          master_flat, adam_mu, adam_nu  [O, n·C] fp32   AdamW leaves, flattened

The layouts depend on the device count, so checkpoints hold the *canonical* form instead (fp32 params + the
optax state of `train.optimizer.make_optimizer`), which Orbax restores onto any mesh; `Zero1Setup.to_canonical`
/ `from_canonical` convert (jitted; at save and restore time only).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax.keys import path_name
from zaya_jax.parallel import sharding
from zaya_jax.train import optimizer as optimizer_lib
from zaya_jax.train.state import TrainState, abstract_train_state, canonical_builder, split_model
from zaya_jax.train.zero1.layout import (
    Arrays,
    Zero1Layout,
    build_layout,
    fill,
    named_leaves,
    pack_global,
    unpack_global,
)


class GroupState(NamedTuple):
    master_slots: jax.Array  # [O, n·s, S] fp32
    momentum: jax.Array  # [O, n·s, S] fp32 (Muon)
    master_flat: jax.Array  # [O, n·C] fp32
    adam_mu: jax.Array  # [O, n·C] fp32
    adam_nu: jax.Array  # [O, n·C] fp32


class Zero1State(NamedTuple):
    step: jax.Array  # [] int32 optimizer steps taken
    params: Any  # nnx.State in the compute dtype
    groups: tuple[GroupState, ...]
    count: jax.Array  # [] int32 optimizer updates (bias corrections of Muon's momentum and AdamW's moments)
    biases: Any  # nnx.State of BalancingBias
    balancing: Any  # balancing.BalancingState


def state_specs(layout: Zero1Layout, abs_state: Zero1State, mesh: Mesh) -> Zero1State:
    replicated = lambda tree: jax.tree.map(lambda _: P(), tree)  # noqa: E731
    groups = tuple(GroupState(*(g.spec(x.ndim) for x in gs)) for g, gs in zip(layout.groups, abs_state.groups))
    return Zero1State(
        P(),
        sharding.tree_specs(abs_state.params, mesh, "zero1", "param"),
        groups,
        P(),
        replicated(abs_state.biases),
        replicated(abs_state.balancing),
    )


def _optax_moments(opt_state: Any) -> tuple[Arrays, Arrays, Arrays, jax.Array]:
    """(Muon momentum, Adam mu, Adam nu) by parameter name, and the update count, from the optax state."""
    muon, mu, nu, counts = {}, {}, {}, []

    def visit(node):
        if isinstance(node, optimizer_lib.MuonState):
            muon.update(_unmasked(node.mu))
            counts.append(node.count)
        elif isinstance(node, optax.ScaleByAdamState):
            mu.update(_unmasked(node.mu))
            nu.update(_unmasked(node.nu))
            counts.append(node.count)
        elif isinstance(node, optax.ScaleByScheduleState):
            counts.append(node.count)
        return node

    jax.tree.map(visit, opt_state, is_leaf=_is_moment_state)
    return muon, mu, nu, counts[0] if counts else jnp.zeros((), jnp.int32)


def _is_moment_state(x) -> bool:
    return isinstance(x, (optimizer_lib.MuonState, optax.ScaleByAdamState, optax.ScaleByScheduleState))


def _unmasked(tree: Any) -> Arrays:
    return dict(named_leaves(tree))  # optax.MaskedNode has no leaves


def _with_moments(template: Any, muon: Arrays, mu: Arrays, nu: Arrays, count: jax.Array) -> Any:
    """The optax state `template` (abstract) with its moment trees and counts filled in."""

    def put(tree, values):
        return jax.tree_util.tree_map_with_path(lambda p, _: values[path_name(p)], tree)

    def visit(node):
        if isinstance(node, optimizer_lib.MuonState):
            return optimizer_lib.MuonState(count, put(node.mu, muon))
        if isinstance(node, optax.ScaleByAdamState):
            return optax.ScaleByAdamState(count, put(node.mu, mu), put(node.nu, nu))
        if isinstance(node, optax.ScaleByScheduleState):  # the learning-rate schedules' step
            return optax.ScaleByScheduleState(count)
        raise ValueError(f"zero1: optimizer state {type(node).__name__} has no ZeRO-1 counterpart")

    return jax.tree.map(visit, template, is_leaf=_is_moment_state)


def from_canonical(layout: Zero1Layout, sizes: dict[str, int], canonical: TrainState) -> Zero1State:
    """Canonical per-parameter TrainState (global arrays) → Zero1State (trace under jit with out shardings)."""
    params = dict(named_leaves(canonical.params))
    muon, mu, nu, count = _optax_moments(canonical.opt_state)
    zeros = {n: jnp.zeros(x.shape, jnp.float32) for n, x in params.items()}
    master = pack_global(layout, sizes, params)
    moments = pack_global(layout, sizes, {**zeros, **muon})
    adam = (pack_global(layout, sizes, {**zeros, **mu}), pack_global(layout, sizes, {**zeros, **nu}))
    groups = tuple(GroupState(m[0], mo[0], m[1], a_mu[1], a_nu[1]) for m, mo, a_mu, a_nu in zip(master, moments, *adam))
    compute = jax.tree.map(lambda x: x.astype(layout.compute_dtype), canonical.params)
    return Zero1State(
        canonical.step, compute, groups, jnp.asarray(count, jnp.int32), canonical.biases, canonical.balancing
    )


def to_canonical(layout: Zero1Layout, sizes: dict[str, int], state: Zero1State, opt_template: Any) -> TrainState:
    """Zero1State → canonical TrainState (params in `model.param_dtype`, the optax state of `make_optimizer`)."""
    master = unpack_global(layout, sizes, [(g.master_slots, g.master_flat) for g in state.groups])
    muon = unpack_global(layout, sizes, [(g.momentum, g.master_flat) for g in state.groups])
    mu = unpack_global(layout, sizes, [(g.master_slots, g.adam_mu) for g in state.groups])
    nu = unpack_global(layout, sizes, [(g.master_slots, g.adam_nu) for g in state.groups])
    params = fill(state.params, {n: x.astype(layout.param_dtype) for n, x in master.items()})
    opt_state = _with_moments(opt_template, muon, mu, nu, state.count)
    return TrainState(state.step, params, opt_state, state.biases, state.balancing)


def named_shardings(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


# ----------------------------------------------------------------------------- creation


class Zero1Setup:
    """Everything the ZeRO-1 step and its checkpoints need besides the state itself."""

    def __init__(
        self,
        layout: Zero1Layout,
        sizes: dict,
        shardings: Zero1State,
        canonical_shardings: TrainState,
        abstract_canonical: TrainState,
    ):
        self.layout, self.sizes = layout, sizes  # owner layouts; mesh axis sizes
        self.shardings = shardings  # NamedShardings of the Zero1State
        self.canonical_shardings = canonical_shardings  # of the per-parameter TrainState (checkpoints)
        self.abstract_canonical = abstract_canonical  # ShapeDtypeStructs with shardings (Orbax restore target)
        # The layouts do not map onto per-parameter shardings: gather the input first (one leaf at a time when
        # memory is tight), then every device picks its own output shards. Save/restore time only.
        everywhere = NamedSharding(jax.tree.leaves(shardings)[0].mesh, P())
        gather = lambda tree: jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, everywhere), tree)  # noqa
        self._to = jax.jit(
            lambda s: to_canonical(layout, sizes, gather(s), abstract_canonical.opt_state),
            out_shardings=canonical_shardings,
        )
        self._from = jax.jit(lambda c: from_canonical(layout, sizes, gather(c)), out_shardings=shardings)

    def to_canonical(self, state: Zero1State) -> TrainState:
        return self._to(state)

    def from_canonical(self, canonical: TrainState) -> Zero1State:
        return self._from(canonical)


def zero1_setup(
    config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation
) -> tuple[Any, Zero1Setup, Zero1State]:
    """(graphdef, setup, abstract Zero1State with shardings) for `config` on `mesh` — nothing is allocated."""
    graphdef, abs_canonical, canonical_shardings = abstract_train_state(config, mesh, tx)
    layout = build_layout(config, mesh, abs_canonical.params)
    sizes = dict(mesh.shape)
    abs_state = jax.eval_shape(lambda c: from_canonical(layout, sizes, c), abs_canonical)
    shardings = named_shardings(mesh, state_specs(layout, abs_state, mesh))
    abs_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abs_state, shardings)
    return graphdef, Zero1Setup(layout, sizes, shardings, canonical_shardings, abs_canonical), abs_state


def create_zero1_state(
    config: ml_collections.ConfigDict, mesh: Mesh, tx: optax.GradientTransformation, model: Any = None
) -> tuple[Any, Zero1Setup, Zero1State]:
    """A fresh (or `model`'s) ZeRO-1 state built directly in its shardings. Returns (graphdef, setup, state)."""
    graphdef, setup, _ = zero1_setup(config, mesh, tx)
    build = canonical_builder(config, tx)
    init = lambda *pb: from_canonical(
        setup.layout,
        setup.sizes,  # noqa: E731
        build(nnx.merge(graphdef, *pb) if pb else None),
    )
    with jax.set_mesh(mesh):
        fn = jax.jit(init, out_shardings=setup.shardings)
        state = fn(*split_model(model)[1:]) if model is not None else fn()
    return graphdef, setup, state
