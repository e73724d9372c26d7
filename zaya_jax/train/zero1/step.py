"""The ZeRO-1 train step (the default `train.param_sharding`), as the paper runs it (arXiv 2511.17127 §2;
docs/parallelism.md): one `jax.shard_map` over every mesh axis, so each collective is explicit. Read top to
bottom, per device:

1. `local_grads`: forward/backward of the device's batch shard with the replicated compute-dtype parameters
   (`Zero1State.params`), micro-batches summed locally in fp32 in the owner layout (`zaya_jax.train.zero1.layout`)
   by the shared micro-batch loop (`zaya_jax.train.microbatch`), so no collective runs per micro-batch;
   with `model.remat=full` the backward pass itself adds each layer's gradients into the layout
   (`zaya_jax.train.zero1.fused_backward`);
2. `reduce_scatter`: the packed gradients in `train.grad_reduce_dtype` to their owners (with
   `train.overlap_collectives`, the Muon matrices' rows chunk by chunk of layers inside the last
   micro-batch's backward pass already); loss sums, expert counts and dropped counts are all-reduced (small);
3. the owners' update (`zaya_jax.train.zero1.update`: clipping, distributed Muon, AdamW) on fp32
   master weights;
4. `all_gather`: the updated parameters in the compute dtype, written into the (donated) previous ones; then
   the balancing controller's update and the metrics (replicated, from the global counts;
   `zaya_jax.train.step_metrics`).

Context parallelism (CP halos, K/V all-gather) and expert parallelism (all-to-all) run inside the model as
explicit per-device collectives (`zaya_jax.parallel.mesh.in_manual_region`).
"""

from __future__ import annotations

import functools
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
from zaya_jax.train import microbatch, schedule
from zaya_jax.train.microbatch import BATCH_KEYS, Totals, micro_loss
from zaya_jax.train.optimizer import squared_norm
from zaya_jax.train.step_metrics import balance_and_metrics
from zaya_jax.train.step_wrapper import step_on_mesh
from zaya_jax.train.zero1 import fused_backward
from zaya_jax.train.zero1 import update as dist
from zaya_jax.train.zero1.fused_backward import LAYERS
from zaya_jax.train.zero1.layout import (
    Group,
    by_chunk,
    fill,
    local_shapes,
    named_leaves,
    pack_flat,
    pack_slots,
    sink_pieces,
    unpack_flat,
    unpack_slots,
    zero_pieces,
)
from zaya_jax.train.zero1.state import GroupState, Zero1Setup, Zero1State

# per group (Muon slots [rows, S] as P buffers of [rows / P, S], `layout.sink_pieces`; AdamW flat [n·C])
Packed = list[tuple[tuple[jax.Array, ...], jax.Array]]
# per group: this device's owned Muon slots chunk by chunk (C × [s_c, S]; one [s, S] without layer chunks) and
# its owned AdamW elements [C]
Owned = list[tuple[tuple[jax.Array, ...], jax.Array]]

# ----------------------------------------------------------------------------- 1. local gradients


def local_grads(
    graphdef, state: Zero1State, batch: dict, config: ml_collections.ConfigDict, setup: Zero1Setup
) -> tuple[Packed, Totals, bool]:
    """This device's summed gradients packed in the owner layout in `train.grad_reduce_dtype` (per group slots
    [n·s, S] and flat [n·C]), its Totals, and whether the slots are reduce-scattered already (then this
    device's [s, S]). Either way no collective runs per micro-batch (bar the scattering pass's own)."""
    grads_of = _fused_grads if config.model.remat == "full" else _packed_grads
    return grads_of(graphdef, state, batch, config, setup, jnp.dtype(config.train.grad_reduce_dtype))


def _pack(setup: Zero1Setup, grads: Any, acc: Packed) -> Packed:
    """acc + `grads` (a parameter tree) in the owner layout (fp32, the slots added layer by layer in place)."""
    leaves, pieces = dict(named_leaves(grads)), sink_pieces(setup.layout)
    out = []
    for group, (slots, flat) in zip(setup.layout.groups, acc):
        slots = pack_slots(group.slots, leaves, jnp.float32, slots, pieces)
        out.append((slots, flat + pack_flat(group.flat, leaves, jnp.float32)))
    return out


def _packed_grads(graphdef, state: Zero1State, batch: dict, config, setup: Zero1Setup, reduce_dtype):
    """`local_grads` by plain autodiff of each micro-batch, its gradients added into the packed fp32 layout."""
    grad_fn = jax.grad(lambda p, mb: micro_loss(graphdef, p, state.biases, mb, config), has_aux=True)

    def add_grads(acc, mb):
        grads, aux = grad_fn(state.params, mb)
        return _pack(setup, grads, acc), aux

    packed, totals = microbatch.accumulate(add_grads, _empty(setup), batch, config)
    return jax.tree.map(lambda x: x.astype(reduce_dtype), packed), totals, False


def _empty(setup: Zero1Setup) -> Packed:
    """Zero fp32 packed buffers per group: slots [n·s, S] in P pieces and flat [n·C] (sized 0 where the group has
    none)."""
    pieces = sink_pieces(setup.layout)
    return [
        (zero_pieces(g.slots, pieces, jnp.float32), jnp.zeros((g.flat.padded if g.flat.size else 0,), jnp.float32))
        for g in setup.layout.groups
    ]


def _split_layers(params: Any) -> tuple[Any, Any]:
    """(the stacked layers' parameters, every other parameter) of a model's parameter State."""
    return params[LAYERS], nnx.State({k: v for k, v in params.items() if k != LAYERS})


def _fused_grads(graphdef, state: Zero1State, batch: dict, config, setup: Zero1Setup, reduce_dtype):
    """`local_grads` with the layers' gradients added in fp32 inside the backward pass (`fused_backward`'s
    sinks, already in the owner layout): no gradient-sized array besides them. With layer chunks
    (`train.overlap_collectives`) the last micro-batch's backward pass also reduce-scatters them, so the
    returned slots are this device's owned sums [s, S] (`scattered`)."""
    layer_params, other = _split_layers(state.params)
    scattered = fused_backward.scatters(setup)

    def add_grads(scatter: bool):
        def loss(other_params, sinks, mb):
            params = nnx.State({**other_params, LAYERS: layer_params})
            runner = fused_backward.accumulating_layers(setup, sinks, reduce_dtype if scatter else None)
            return micro_loss(graphdef, params, state.biases, mb, config, run_layers=runner)

        grad_fn = jax.grad(loss, argnums=(0, 1), has_aux=True)

        def add(acc, mb):
            other_acc, sinks = acc
            (grads, sinks), aux = grad_fn(other, sinks, mb)
            return (microbatch.add_fp32(other_acc, grads), sinks), aux

        return add

    shapes = {f"{LAYERS}/{n}": x.shape for n, x in named_leaves(layer_params)}
    zeros = (microbatch.fp32_zeros(other), fused_backward.zero_sinks(setup, shapes))
    last = add_grads(True) if scattered else None
    (other_grads, sinks), totals = microbatch.accumulate(add_grads(False), zeros, batch, config, last)
    leaves = dict(named_leaves(other_grads))
    packed = []
    for group, slots, small in zip(setup.layout.groups, sinks.slots, sinks.small):
        rows = (fused_backward.owned_rows(group, slots[0]),) if scattered and slots[0].size else slots
        packed.append(
            (tuple(x.astype(reduce_dtype) for x in rows), pack_flat(group.flat, {**leaves, **small}, reduce_dtype))
        )
    return packed, totals, scattered


# ----------------------------------------------------------------------------- 2. reduce-scatter


def reduce_scatter(setup: Zero1Setup, packed: Packed, scattered: bool) -> tuple[Owned, jax.Array]:
    """Per group, the packed local partial sums (slots [n·s, S] in P pieces, flat [n·C]) → [s_c, S] per layer
    chunk and [C]: the sums over the group's devices of exactly what this device owns; and Σ x² over all of
    them (fp32, for the clipping). One reduce-scatter per slot piece (a layer chunk's [n·s_c, S] → [s_c, S]: a
    whole buffer, no copy), then the elementwise leaves', in turn: each waits (an optimization barrier) for the
    previous one and for the squared norm of the one before that (the second also for the elementwise leaves'
    packing), so XLA's combiner keeps them apart and a GPU computes each piece's norm while the next piece is in
    flight — with global-norm clipping, nothing else of the update can run before the last scatter. Slots the
    backward pass reduce-scattered already (`scattered`: [C·s_c, S]) are split into their chunks."""
    sq, prev = jnp.zeros((), jnp.float32), None  # prev: the latest scatter's result, not yet in sq

    def scatter(x, axes):
        nonlocal sq, prev
        if not x.size:
            return x
        if prev is not None:
            x, prev, sq = jax.lax.optimization_barrier((x, prev, sq))
        y = jax.lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True)
        if prev is not None:
            sq = sq + squared_norm(prev)
        prev = y
        return y

    out = []
    for group, (slots, flat) in zip(setup.layout.groups, packed):
        if scattered:
            owned = by_chunk(slots[0], group.slots.chunks)
            sq = sq + squared_norm(owned)
        else:
            owned = []
            for rows in slots:
                if len(owned) == 1 and flat.size:  # packing the elementwise leaves: beside the first scatter
                    rows, flat = jax.lax.optimization_barrier((rows, flat))
                owned.append(scatter(rows, group.axes))
        out.append((tuple(owned), scatter(flat, group.axes)))
    return out, sq if prev is None else sq + squared_norm(prev)


def _owned_grads(
    graphdef, state: Zero1State, batch: dict, config, setup: Zero1Setup
) -> tuple[Owned, jax.Array, Totals]:
    """Steps 1–2: this device's owned gradient sums per group ([s_c, S] per chunk, [C]), their Σ x², and the
    global Totals."""
    packed, totals, scattered = local_grads(graphdef, state, batch, config, setup)
    owned, sq = reduce_scatter(setup, packed, scattered)
    return owned, sq, jax.lax.psum(totals, AXES)


# ----------------------------------------------------------------------------- 4. all-gather


def all_gather(group: Group, slots: tuple[jax.Array, ...], flat: jax.Array, dtype, as_bits: bool = False) -> tuple:
    """C × [s_c, S], [C] owned master weights → C × [n·s_c, S] (chunk c's rows in packed order), [n·C]
    everyone's, in `dtype`: one all-gather per chunk, each needing only its own chunk's update (and the previous
    gather: the flat one's, then chunk c − 1's), so the next chunk's Newton–Schulz can run while it is in flight.

    as_bits: 2-byte dtypes travel as uint16 (`Kernels.collectives_as_bits`: XLA:CPU runs bf16 collectives in
    fp32; a gather only moves bits)."""
    bits = jnp.uint16 if as_bits and jnp.dtype(dtype).itemsize == 2 else None

    def ag(x):
        x = x.astype(dtype)
        if not x.size:
            return x
        if bits is None:
            return jax.lax.all_gather(x, group.axes, axis=0, tiled=True)
        y = jax.lax.all_gather(jax.lax.bitcast_convert_type(x, bits), group.axes, axis=0, tiled=True)
        return jax.lax.bitcast_convert_type(y, dtype)

    # the elementwise leaves first (their update is ready first), then the chunks, each gather waiting for the
    # previous one: XLA's combiner cannot merge them, and the scheduler meets them in pipeline order
    gathered = [ag(flat)]
    for x in slots:
        if gathered[-1].size and x.size:
            x, gathered[-1] = jax.lax.optimization_barrier((x, gathered[-1]))
        gathered.append(ag(x))
    return tuple(gathered[1:]), gathered[0]


def _gathered(setup: Zero1Setup, owned: Owned, dtype, as_bits: bool = False, into: Any = None) -> dict:
    """Every group's owned (C × [s_c, S], flat [C]) all-gathered in `dtype` (as uint16 bits where `as_bits`) and
    unpacked to {name: local leaf}; the slots written chunk by chunk, layer by layer into `into`'s arrays when
    given."""
    old, values = (None if into is None else dict(named_leaves(into))), {}
    for group, (slots, flat) in zip(setup.layout.groups, owned):
        shapes = local_shapes(setup.layout, group, setup.sizes)
        chunk_rows, full_flat = all_gather(group, slots, flat, dtype, as_bits)
        values.update(unpack_slots(group.slots, chunk_rows, shapes, into=old))
        values.update(unpack_flat(group.flat, full_flat, shapes))
    return values


# ----------------------------------------------------------------------------- the step


def zero1_local_step(
    state: Zero1State,
    batch: dict,
    *,
    graphdef,
    setup: Zero1Setup,
    config: ml_collections.ConfigDict,
    lrs: dict[str, Callable],
    lr_fn: Callable | None,
    as_bits: bool,
):
    """One optimizer step on this device's shard (called inside the shard_map). Returns (state, metrics).
    as_bits: all-gather 2-byte parameters as uint16 (`Kernels.collectives_as_bits`)."""
    owned, sq, totals = _owned_grads(graphdef, state, batch, config, setup)
    scale = 1.0 / jnp.maximum(totals.loss.tokens, 1.0)
    # 3. the owners' update (the [O, rows, …] state arrays arrive as [1, rows, …] inside the shard_map)
    local = [GroupState(*(x[0] for x in g)) for g in state.groups]
    compute = dtype_of(config.model.dtype)
    groups, masters, grad_norm = dist.update(
        setup.layout.groups, local, owned, sq, scale, state.count, lrs, config.optimizer, compute
    )
    # 4. the updated parameters, chunk by chunk, written into the (donated) previous ones
    params = fill(state.params, _gathered(setup, masters, compute, as_bits, into=state.params))
    lr = None if lr_fn is None else lr_fn(state.step)
    biases, bal_state, metrics = balance_and_metrics(
        state.biases, state.balancing, totals, grad_norm, config, lr, state.step
    )
    new_groups = tuple(GroupState(*(x[None] for x in g)) for g in groups)
    return Zero1State(state.step + 1, params, new_groups, state.count + 1, biases, bal_state), metrics


def _shard_mapped(fn: Callable, setup: Zero1Setup, mesh: Mesh, out_specs) -> tuple[Callable, dict]:
    """`fn(state, batch)` shard_mapped over every mesh axis (state by its shardings, batch rows over
    data × expert and the sequence over context), and the batch's global NamedShardings."""
    specs = jax.tree.map(lambda s: s.spec, setup.shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    batch_spec = {k: sharding.batch_spec(2) for k in BATCH_KEYS}
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=(specs, batch_spec), out_specs=out_specs(specs), check_vma=False)
    return mapped, {k: NamedSharding(mesh, s) for k, s in batch_spec.items()}


def make_zero1_train_step(
    graphdef, setup: Zero1Setup, config: ml_collections.ConfigDict, mesh: Mesh, lr_fn: Callable | None = None
):
    """`step(state, batch) -> (state, metrics)`: the shard_map'ed step, jitted with the state donated."""
    local_step = functools.partial(
        zero1_local_step,
        graphdef=graphdef,
        setup=setup,
        config=config,
        lrs=schedule.learning_rate_schedules(config),
        lr_fn=lr_fn,
        as_bits=kernels.resolve(config.model).collectives_as_bits,
    )
    body, batch_sharding = _shard_mapped(local_step, setup, mesh, lambda specs: (specs, P()))
    fn = jax.jit(
        body, in_shardings=(setup.shardings, batch_sharding), out_shardings=(setup.shardings, None), donate_argnums=(0,)
    )
    return step_on_mesh(fn, mesh)


def make_zero1_grads(graphdef, setup: Zero1Setup, config: ml_collections.ConfigDict, mesh: Mesh):
    """`grads(state, batch) -> (mean loss, mean gradients as a parameter tree (fp32), counts, dropped)`: the
    gradients the ZeRO-1 step hands to its owners, gathered back (for tests and debugging)."""

    def local(state, batch):
        owned, _, totals = _owned_grads(graphdef, state, batch, config, setup)
        values = _gathered(setup, owned, jnp.float32)
        n = jnp.maximum(totals.loss.tokens, 1.0)
        grads = fill(state.params, {k: v * (1.0 / n) for k, v in values.items()})  # as in step.train_step
        return totals.loss.ce / n, grads, totals.counts, totals.dropped

    body, _ = _shard_mapped(local, setup, mesh, lambda specs: (P(), specs.params, P(), P()))
    return step_on_mesh(jax.jit(body), mesh)
