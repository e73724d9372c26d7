"""Gradient accumulation fused into the layer stack's backward pass (ZeRO-1 step with `model.remat=full`).

Plain autodiff of the stacked layers returns every parameter's gradient as a separate [L, ...] array in the
compute dtype, which the step then packs into its fp32 reduce-scatter buffers: both live at once, and with
micro-batches a third, gradient-sized accumulator too. Here the layer stack is a `jax.custom_vjp` whose
backward pass walks the layers in reverse, recomputes each layer's forward (what remat=full does anyway), and
adds the layer's parameter gradients in fp32 straight into the *sinks* — the owner-layout slot buffer
(rows [l·B, (l+1)·B) of layer l, `zaya_jax.train.zero1.layout`) and [L, ...] buffers for the layer's small
elementwise leaves — in place. Accumulation over micro-batches is the same sinks carried from one backward
pass to the next (Megatron's fused gradient accumulation, arXiv 2511.17127 §2's ZeRO-1 setting).

The sinks enter as a primal argument whose "gradient" is defined as sinks + this pass's parameter
gradients; the stacked parameters themselves get no cotangent (the caller differentiates with respect to the
sinks and the non-layer parameters only).

*Scattering* pass (`train.overlap_collectives`, the last micro-batch; the owner layouts have C > 1 layer
chunks, `zaya_jax.train.zero1.owners`): the backward walks the chunks in reverse, and after each chunk's k layers
have added their gradients into the sinks (the earlier micro-batches' sums folded in), reduce-scatters that
chunk's rows in `train.grad_reduce_dtype` — inside the layer loop, where XLA's latency-hiding scheduler can
run it alongside the next chunk's backward (Megatron's `overlap_grad_reduce`). The "gradient" of a second
primal, `owned` (per group [s, S]), is then this device's reduce-scattered rows.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from zaya_jax.keys import path_name
from zaya_jax.model.layers import BalancingBias
from zaya_jax.train.zero1.layout import layer_bins
from zaya_jax.train.zero1.state import Zero1Setup

LAYERS = "layers"  # name of the stacked layer module inside Zaya (parameter paths start with "layers/")


class Sinks(NamedTuple):
    """Per group: slots [s·n, S] fp32 (the group's Muon matrices, owner layout) and {name: [L, ...] fp32} for
    the group's elementwise per-layer leaves."""

    slots: tuple[jax.Array, ...]
    small: tuple[dict[str, jax.Array], ...]


def layer_leaf_names(setup: Zero1Setup) -> tuple[tuple[str, ...], ...]:
    """Per group, the elementwise (flat-layout) leaves that belong to the layer stack."""
    return tuple(tuple(n for n, _ in g.flat.leaves if n.startswith(LAYERS + "/")) for g in setup.layout.groups)


def zero_sinks(setup: Zero1Setup, shapes: dict[str, tuple[int, ...]]) -> Sinks:
    """Empty sinks; `shapes`: local shapes of the layer leaves."""
    slots = tuple(jnp.zeros((g.slots.rows, g.slots.bin_size), jnp.float32) for g in setup.layout.groups)
    small = tuple({n: jnp.zeros(shapes[n], jnp.float32) for n in names} for names in layer_leaf_names(setup))
    return Sinks(slots, small)


def zero_owned(setup: Zero1Setup, dtype) -> tuple[jax.Array, ...]:
    """Per group, this device's [s, S] owned rows in `dtype` (zeros): the primal the scattering pass
    differentiates with respect to."""
    return tuple(jnp.zeros((g.slots.slots, g.slots.bin_size), dtype) for g in setup.layout.groups)


def scatters(setup: Zero1Setup) -> bool:
    """Whether the owner layouts have layer chunks, i.e. the step reduce-scatters inside the layer loop."""
    return any(g.slots.chunks > 1 for g in setup.layout.groups)


def _add_layer(setup: Zero1Setup, sinks: Sinks, grads: dict[str, jax.Array], layer: jax.Array) -> Sinks:
    """sinks += one layer's parameter gradients {full name: [...]} at layer `layer` (in place)."""
    slots, small = [], []
    for group, buf, names, acc in zip(setup.layout.groups, sinks.slots, layer_leaf_names(setup), sinks.small):
        if group.slots.num_bins:
            per, size, row = group.slots.bins_per_layer, group.slots.bin_size, group.slots.layer_row(layer)
            rows = layer_bins(group.slots, grads, jnp.float32)
            old = jax.lax.dynamic_slice(buf, (row, 0), (per, size))
            buf = jax.lax.dynamic_update_slice(buf, old + rows, (row, 0))
        slots.append(buf)
        small.append(
            {
                n: jax.lax.dynamic_update_index_in_dim(
                    acc[n],
                    jax.lax.dynamic_index_in_dim(acc[n], layer, keepdims=False) + grads[n].astype(jnp.float32),
                    layer,
                    0,
                )
                for n in names
            }
        )
    return Sinks(tuple(slots), tuple(small))


def accumulating_layers(setup: Zero1Setup, sinks: Sinks, owned: tuple | None = None, reduce_dtype=None):
    """A `LayerRunner` for `Zaya.hidden_states` that runs the stack like `scan_layers(remat="full")` and whose
    backward pass adds the parameter gradients into `sinks` (differentiate with respect to `sinks`) — and,
    with `owned` (`zero_owned`), reduce-scatters the sinks chunk by chunk in `reduce_dtype` (differentiate
    with respect to `owned` too: its gradient is this device's summed rows)."""
    scatter = None if owned is None else jnp.dtype(reduce_dtype)

    def run(graphdef, stacked, r, a, positions, layout, remat):
        layers_graph, params, rest = nnx.split(nnx.merge(graphdef, stacked), nnx.Param, BalancingBias)
        return _stack(layers_graph, layout, setup, scatter, params, rest, sinks, owned or (), r, a, positions)

    return run


def _layer(graphdef, layout, positions):
    """One decoder layer as f(params, rest, r, a) -> ((r, a), MoEStats) of its variables."""

    def f(params, rest, r, a):
        r, a, stats = nnx.merge(graphdef, params, rest)(r, a, positions, layout)
        return (r, a), stats

    return f


def _at(tree: Any, layer: jax.Array) -> Any:
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, layer, keepdims=False), tree)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _stack(graphdef, layout, setup, scatter, params, rest, sinks, owned, r, a, positions):
    return _forward(graphdef, layout, params, rest, r, a, positions)[0]


def _forward(graphdef, layout, params, rest, r, a, positions):
    layer = _layer(graphdef, layout, positions)

    def body(carry, xs):
        (r_out, a_out), stats = layer(*xs, *carry)
        return (r_out, a_out), (carry, stats)

    (r, _), (inputs, stats) = jax.lax.scan(body, (r, a), (params, rest))
    return (r, stats), inputs


def _stack_fwd(graphdef, layout, setup, scatter, params, rest, sinks, owned, r, a, positions):
    out, inputs = _forward(graphdef, layout, params, rest, r, a, positions)
    return out, (params, rest, sinks, owned, inputs, positions)


def _stack_bwd(graphdef, layout, setup, scatter, res, cotangents):
    params, rest, sinks, owned, (r_in, a_in), positions = res
    layer = _layer(graphdef, layout, positions)
    num_layers = r_in.shape[0]

    def body(carry, xs):
        dr, da, sinks = carry
        index, r, a = xs
        p, q = _at(params, index), _at(rest, index)
        _, pull, _ = jax.vjp(lambda p_, r_, a_: layer(p_, q, r_, a_), p, r, a, has_aux=True)
        dp, dr, da = pull((dr, da))
        grads = {f"{LAYERS}/{path_name(k)}": g for k, g in jax.tree_util.tree_leaves_with_path(dp)}
        return (dr, da, _add_layer(setup, sinks, grads, index)), None

    init = (cotangents[0], jnp.zeros_like(a_in[0]), sinks)
    if scatter is None:
        (dr, da, sinks), _ = jax.lax.scan(body, init, (jnp.arange(num_layers), r_in, a_in), reverse=True)
        return None, None, sinks, None, dr, da, None
    chunks = max(g.slots.chunks for g in setup.layout.groups)
    k = num_layers // chunks

    def chunk(carry, xs):
        (dr, da, sinks), owned = carry
        c, r, a = xs  # r, a: the chunk's k layer inputs
        (dr, da, sinks), _ = jax.lax.scan(body, (dr, da, sinks), (c * k + jnp.arange(k), r, a), reverse=True)
        return ((dr, da, sinks), _scatter_chunk(setup, sinks, owned, c, scatter)), None

    split = lambda x: x.reshape(chunks, k, *x.shape[1:])  # noqa: E731
    ((dr, da, sinks), owned), _ = jax.lax.scan(
        chunk, (init, owned), (jnp.arange(chunks), split(r_in), split(a_in)), reverse=True
    )
    return None, None, sinks, owned, dr, da, None


def _scatter_chunk(setup: Zero1Setup, sinks: Sinks, owned: tuple, chunk: jax.Array, dtype) -> tuple:
    """owned rows of layer chunk `chunk` ← the group-wide sums of the sinks' rows of that chunk (one
    reduce-scatter per group, in `dtype`)."""
    out = []
    for group, buf, mine in zip(setup.layout.groups, sinks.slots, owned):
        s = group.slots
        if s.num_bins:
            rows = jax.lax.dynamic_slice(buf, (chunk * s.chunk_rows, 0), (s.chunk_rows, s.bin_size)).astype(dtype)
            part = jax.lax.psum_scatter(rows, group.axes, scatter_dimension=0, tiled=True)
            mine = jax.lax.dynamic_update_slice(mine, part, (chunk * s.chunk_slots, 0))
        out.append(mine)
    return tuple(out)


_stack.defvjp(_stack_fwd, _stack_bwd)
