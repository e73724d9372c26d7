"""The ZeRO-1 train step (the default `train.param_sharding`), as the paper runs it (arXiv 2511.17127 §2;
docs/parallelism.md): one `jax.shard_map` over every mesh axis, so each collective is explicit.

Per device:
1. forward/backward of its batch shard with the replicated compute-dtype parameters (`Zero1State.params`),
   micro-batches accumulated locally in the owner layout (fp32), so no collective runs per micro-batch;
2. reduce-scatter of the packed gradients in `train.grad_reduce_dtype` to their owners (with
   `train.overlap_collectives`, the Muon matrices' chunk by chunk of layers inside the last micro-batch's
   backward layer loop, `zaya_jax.train.accumulate`); loss sums, expert
   counts and dropped counts are all-reduced (small);
3. the owners' update (`zaya_jax.train.distributed_optimizer`: clipping, distributed Muon, AdamW) on fp32
   master weights;
4. all-gather of the updated parameters in the compute dtype; the balancing controller's update (replicated,
   from the global counts).

Context parallelism (CP halos, K/V all-gather) and expert parallelism (all-to-all) run inside the model as
explicit per-device collectives (`zaya_jax.parallel.mesh.in_manual_region`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax import kernels
from zaya_jax.model.layers import dtype_of
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES
from zaya_jax.train import accumulate, schedule
from zaya_jax.train import distributed_optimizer as dist
from zaya_jax.train.accumulate import LAYERS
from zaya_jax.train.step import BATCH_KEYS, balance_and_metrics, micro_loss, micro_split, zero_stats
from zaya_jax.train.zero1 import (
    Zero1Setup,
    Zero1State,
    fill,
    local_shapes,
    named_leaves,
    pack_flat,
    pack_slots,
    unpack_flat,
    unpack_slots,
)


def _pack(setup: Zero1Setup, grads: Any, dtype, acc: list | None = None) -> list[tuple[jax.Array, jax.Array]]:
    """Per group (slots [n·s, S], flat [n·C]) of `grads` in `dtype`, added to `acc` (in place) when given."""
    leaves = dict(named_leaves(grads))
    out = []
    for k, g in enumerate(setup.layout.groups):
        slots = pack_slots(g.slots, leaves, dtype, None if acc is None else acc[k][0])
        flat = pack_flat(g.flat, leaves, dtype)
        out.append((slots, flat if acc is None else acc[k][1] + flat))
    return out


def split_layers(params: Any) -> tuple[Any, Any]:
    """(the stacked layers' parameters, every other parameter) of a model's parameter State."""
    return params[LAYERS], nnx.State({k: v for k, v in params.items() if k != LAYERS})


def _fused_local_grads(graphdef, state: Zero1State, batch: dict, config: ml_collections.ConfigDict, setup: Zero1Setup):
    """`local_grads` with the layers' gradients accumulated in fp32 inside the backward pass
    (`zaya_jax.train.accumulate`): no gradient-sized array besides the reduce-scatter buffers. With layer
    chunks (`train.overlap_collectives`) the last micro-batch's backward also reduce-scatters them: the
    returned slots are then this device's owned sums [s, S] already (`scattered`)."""
    layer_params, other = split_layers(state.params)
    reduce_dtype = jnp.dtype(config.train.grad_reduce_dtype)
    scattered = accumulate.scatters(setup)

    def grads(scatter: bool):
        def loss(other_params, sinks, owned, mb):
            params = nnx.State({**other_params, LAYERS: layer_params})
            runner = accumulate.accumulating_layers(setup, sinks, owned if scatter else None, reduce_dtype)
            return micro_loss(graphdef, params, state.biases, mb, config, run_layers=runner)

        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)

    shapes = {f"{LAYERS}/{n}": x.shape for n, x in named_leaves(layer_params)}
    sinks = accumulate.zero_sinks(setup, shapes)
    owned = accumulate.zero_owned(setup, reduce_dtype) if scattered else ()
    mb = config.train.microbatches
    if mb == 1:
        (other_grads, sinks, owned), (sums, stats) = grads(scattered)(other, sinks, owned, batch)
        counts, dropped = stats.counts, stats.dropped
    else:
        accumulate_fn = grads(False)

        def body(carry, mb_):
            (g, sinks, _), (sums, stats) = accumulate_fn(other, carry[1], (), mb_)
            return _accumulated(carry, sinks, g, sums, stats), None

        f32 = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)  # noqa: E731
        split = micro_split(batch, mb)
        # with layer chunks the last micro-batch runs on its own: its backward pass reduce-scatters
        rest = jax.tree.map(lambda x: x[:-1], split) if scattered else split
        carry, _ = jax.lax.scan(body, (f32(other), sinks, *zero_stats(config)), rest)
        if scattered:
            last = jax.tree.map(lambda x: x[-1], split)
            (g, sinks, owned), (sums, stats) = grads(True)(other, carry[1], owned, last)
            carry = _accumulated(carry, sinks, g, sums, stats)
        other_grads, sinks, sums, counts, dropped = carry
    leaves = dict(named_leaves(other_grads))
    packed = []
    for k, (group, small) in enumerate(zip(setup.layout.groups, sinks.small)):
        rows = owned[k] if scattered else sinks.slots[k]
        packed.append((rows.astype(reduce_dtype), pack_flat(group.flat, {**leaves, **small}, reduce_dtype)))
    return packed, sums, counts, dropped, scattered


def _accumulated(carry, sinks, grads, sums, stats):
    """The micro-batch carry (fp32 non-layer gradients, sinks, loss sums, counts, dropped) after one more
    micro-batch, whose backward pass left the layers' gradients in `sinks`."""
    acc, _, sums_acc, counts, dropped = carry
    return (
        jax.tree.map(lambda x, g: x + g.astype(jnp.float32), acc, grads),
        sinks,
        jax.tree.map(jnp.add, sums_acc, sums),
        counts + stats.counts,
        dropped + stats.dropped,
    )


def local_grads(graphdef, state: Zero1State, batch: dict, config: ml_collections.ConfigDict, setup: Zero1Setup):
    """This device's summed gradients packed in the owner layout (per group slots, flat), its LossSums,
    counts [L, E+1], dropped [L], and whether the slots are reduce-scattered already (this device's [s, S]).

    With `model.remat=full` the layers' gradients are accumulated inside the backward pass
    (`_fused_local_grads`); otherwise plain autodiff, packed afterwards, micro-batches accumulated in fp32 in the
    packed layout itself (layer by layer, in place). Either way no collective runs per micro-batch."""
    if config.model.remat == "full":
        return _fused_local_grads(graphdef, state, batch, config, setup)
    grad_fn = jax.grad(lambda p, mb: micro_loss(graphdef, p, state.biases, mb, config), has_aux=True)
    reduce_dtype = jnp.dtype(config.train.grad_reduce_dtype)
    if config.train.microbatches == 1:
        grads, (sums, stats) = grad_fn(state.params, batch)
        return _pack(setup, grads, reduce_dtype), sums, stats.counts, stats.dropped, False

    def body(carry, mb):
        acc, sums_acc, counts, dropped = carry
        grads, (sums, stats) = grad_fn(state.params, mb)
        acc = _pack(setup, grads, jnp.float32, acc)
        return (acc, jax.tree.map(jnp.add, sums_acc, sums), counts + stats.counts, dropped + stats.dropped), None

    shapes = jax.eval_shape(lambda p: _pack(setup, p, jnp.float32), state.params)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    (acc, sums, counts, dropped), _ = jax.lax.scan(
        body, (zeros, *zero_stats(config)), micro_split(batch, config.train.microbatches)
    )
    return jax.tree.map(lambda x: x.astype(reduce_dtype), acc), sums, counts, dropped, False


def _reduce_scatter(setup: Zero1Setup, packed: list, scattered: bool) -> list[tuple[jax.Array, jax.Array]]:
    """Per group this device's owned sums (slots [s, S], flat [C]) of `local_grads`' packed gradients; slots
    that the backward pass reduce-scattered already stay as they are."""
    out = []
    for group, (slots, flat) in zip(setup.layout.groups, packed):
        if scattered:
            out.append((slots, dist.reduce_scatter(group, slots[:0], flat)[1]))
        else:
            out.append(dist.reduce_scatter(group, slots, flat))
    return out


def _gather_params(setup: Zero1Setup, params: Any, groups, dtype, as_bits: bool) -> Any:
    """All-gather every group's updated master weights in `dtype` (as uint16 bits where `as_bits`) and write them
    into the (donated) previous parameter tree `params`, layer by layer."""
    old, values = dict(named_leaves(params)), {}
    for group, state in zip(setup.layout.groups, groups):
        shapes = local_shapes(setup.layout, group, setup.sizes)
        slots, flat = dist.all_gather(group, state.master_slots, state.master_flat, dtype, as_bits)
        values.update(unpack_slots(group.slots, slots, shapes, into=old))
        values.update(unpack_flat(group.flat, flat, shapes))
    return fill(params, values)


def zero1_local_step(
    state: Zero1State,
    batch: dict,
    *,
    graphdef,
    setup: Zero1Setup,
    config: ml_collections.ConfigDict,
    lrs: dict[str, Callable],
    lr_fn: Callable | None,
):
    """One optimizer step on this device's shard (called inside the shard_map). Returns (state, metrics)."""
    packed, sums, counts, dropped, scattered = local_grads(graphdef, state, batch, config, setup)
    sums, counts, dropped = jax.lax.psum((sums, counts, dropped), AXES)
    scale = 1.0 / jnp.maximum(sums.tokens, 1.0)
    grads = []
    for rs_slots, rs_flat in _reduce_scatter(setup, packed, scattered):
        grads.append((rs_slots.astype(jnp.float32) * scale, rs_flat.astype(jnp.float32) * scale))
    local = [dist.local_group_state(g) for g in state.groups]
    compute = dtype_of(config.model.dtype)
    groups, grad_norm = dist.update(setup.layout.groups, local, grads, state.count, lrs, config.optimizer, compute)
    params = _gather_params(setup, state.params, groups, compute, kernels.resolve(config.model).collectives_as_bits)
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
    new = Zero1State(
        state.step + 1, params, tuple(dist.global_group_state(g) for g in groups), state.count + 1, biases, bal_state
    )
    return new, metrics


def make_zero1_train_step(
    graphdef, setup: Zero1Setup, config: ml_collections.ConfigDict, mesh: Mesh, lr_fn: Callable | None = None
):
    """`step(state, batch) -> (state, metrics)`: the shard_map'ed step, jitted with the state donated."""
    specs = jax.tree.map(lambda s: s.spec, setup.shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    batch_spec = {k: sharding.batch_spec(2) for k in BATCH_KEYS}
    body = jax.shard_map(
        lambda s, b: zero1_local_step(
            s,
            b,
            graphdef=graphdef,
            setup=setup,
            config=config,
            lrs=schedule.learning_rate_schedules(config),
            lr_fn=lr_fn,
        ),
        mesh=mesh,
        in_specs=(specs, batch_spec),
        out_specs=(specs, P()),
        check_vma=False,
    )
    batch_sharding = {k: NamedSharding(mesh, s) for k, s in batch_spec.items()}
    fn = jax.jit(
        body, in_shardings=(setup.shardings, batch_sharding), out_shardings=(setup.shardings, None), donate_argnums=(0,)
    )

    def step(state, batch):
        with jax.set_mesh(mesh):
            return fn(state, {k: batch[k] for k in BATCH_KEYS})

    step.jitted = fn
    return step


def make_zero1_grads(graphdef, setup: Zero1Setup, config: ml_collections.ConfigDict, mesh: Mesh):
    """`grads(state, batch) -> (mean loss, mean gradients as a parameter tree (fp32), counts, dropped)`: the
    gradients the ZeRO-1 step hands to its owners, gathered back (for tests and debugging)."""
    specs = jax.tree.map(lambda s: s.spec, setup.shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    batch_spec = {k: sharding.batch_spec(2) for k in BATCH_KEYS}

    def local(state, batch):
        packed, sums, counts, dropped, scattered = local_grads(graphdef, state, batch, config, setup)
        sums, counts, dropped = jax.lax.psum((sums, counts, dropped), AXES)
        values = {}
        for group, rs in zip(setup.layout.groups, _reduce_scatter(setup, packed, scattered)):
            shapes = local_shapes(setup.layout, group, setup.sizes)
            full = dist.all_gather(group, *rs, jnp.float32)
            values.update(unpack_slots(group.slots, full[0], shapes))
            values.update(unpack_flat(group.flat, full[1], shapes))
        n = jnp.maximum(sums.tokens, 1.0)
        grads = fill(state.params, {k: v * (1.0 / n) for k, v in values.items()})  # as in step.train_step
        return sums.ce / n, grads, counts, dropped

    out_grads = specs.params
    body = jax.shard_map(
        local, mesh=mesh, in_specs=(specs, batch_spec), out_specs=(P(), out_grads, P(), P()), check_vma=False
    )

    def grads(state, batch):
        with jax.set_mesh(mesh):
            return jax.jit(body)(state, {k: batch[k] for k in BATCH_KEYS})

    return grads
