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
chunks, `zaya_jax.train.zero1.owners`): the backward walks the chunks in reverse; once a chunk's k layers have
added their gradients into the sinks (the earlier micro-batches' sums folded in), its rows are reduce-scattered
in `train.grad_reduce_dtype` *while the next chunk's backward runs* — software-pipelined by one chunk, so the
scatter is independent of the GEMMs beside it and XLA's latency-hiding scheduler can overlap them (Megatron's
`overlap_grad_reduce`). A chunk's k layers (at most `owners.OVERLAP_CHUNK_LAYERS`) are unrolled in the
chunk loop's body, where the scheduler sees their GEMMs. This device's summed rows of chunk c are written back
over the first s_c of chunk c's own sink rows, which are dead by then (no second owner-sized buffer): `owned_rows`
reads them out.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from zaya_jax.keys import path_name
from zaya_jax.model.layers import BalancingBias
from zaya_jax.train.zero1.layout import layer_bins, piece_row, sink_pieces, zero_pieces
from zaya_jax.train.zero1.state import Zero1Setup

LAYERS = "layers"  # name of the stacked layer module inside Zaya (parameter paths start with "layers/")


class Sinks(NamedTuple):
    """Per group: slots [s·n, S] fp32 (the group's Muon matrices, owner layout) as P buffers of [s·n / P, S]
    (`layout.sink_pieces`: one per layer chunk of the pipelined update, else one) and {name: [L, ...] fp32} for
    the group's elementwise per-layer leaves."""

    slots: tuple[tuple[jax.Array, ...], ...]
    small: tuple[dict[str, jax.Array], ...]


def layer_leaf_names(setup: Zero1Setup) -> tuple[tuple[str, ...], ...]:
    """Per group, the elementwise (flat-layout) leaves that belong to the layer stack."""
    return tuple(tuple(n for n, _ in g.flat.leaves if n.startswith(LAYERS + "/")) for g in setup.layout.groups)


def zero_sinks(setup: Zero1Setup, shapes: dict[str, tuple[int, ...]]) -> Sinks:
    """Empty sinks; `shapes`: local shapes of the layer leaves."""
    pieces = sink_pieces(setup.layout)
    slots = tuple(zero_pieces(g.slots, pieces, jnp.float32) for g in setup.layout.groups)
    small = tuple({n: jnp.zeros(shapes[n], jnp.float32) for n in names} for names in layer_leaf_names(setup))
    return Sinks(slots, small)


def owned_rows(group, slots: jax.Array) -> jax.Array:
    """This device's reduce-scattered rows [C·s_c, S] (chunk-major) from the sinks' slots [C·n·s_c, S] after a
    scattering pass: the first s_c rows of each chunk's n·s_c."""
    s = group.slots
    return slots.reshape(s.chunks, s.chunk_rows, -1)[:, : s.chunk_slots].reshape(s.slots, -1)


def scatters(setup: Zero1Setup) -> bool:
    """Whether the step reduce-scatters the slots' layer chunks inside the layer loop (`Zero1Layout`)."""
    return setup.layout.scatter_in_backward


def _add_layer(setup: Zero1Setup, sinks: Sinks, grads: dict[str, jax.Array], layer: jax.Array, piece: int) -> Sinks:
    """sinks += one layer's parameter gradients {full name: [...]} at layer `layer`, which is in slot buffer
    `piece` (in place)."""
    slots, small, pieces = [], [], sink_pieces(setup.layout)
    for group, bufs, names, acc in zip(setup.layout.groups, sinks.slots, layer_leaf_names(setup), sinks.small):
        if group.slots.num_bins:
            per, size = group.slots.bins_per_layer, group.slots.bin_size
            row, buf = piece_row(group.slots, layer, piece, pieces), bufs[piece]
            rows = layer_bins(group.slots, grads, jnp.float32)
            old = jax.lax.dynamic_slice(buf, (row, 0), (per, size))
            bufs = bufs[:piece] + (jax.lax.dynamic_update_slice(buf, old + rows, (row, 0)),) + bufs[piece + 1 :]
        slots.append(bufs)
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


def accumulating_layers(setup: Zero1Setup, sinks: Sinks, scatter_dtype=None):
    """A `LayerRunner` for `Zaya.hidden_states` that runs the stack like `scan_layers(remat="full")` and whose
    backward pass adds the parameter gradients into `sinks` (differentiate with respect to `sinks`) — and,
    with `scatter_dtype`, reduce-scatters them chunk by chunk in that dtype (`owned_rows` of the sinks'
    gradient is then this device's summed rows)."""
    scatter = None if scatter_dtype is None else jnp.dtype(scatter_dtype)

    def run(graphdef, stacked, r, a, positions, layout, remat):
        layers_graph, params, rest = nnx.split(nnx.merge(graphdef, stacked), nnx.Param, BalancingBias)
        return _stack(layers_graph, layout, setup, scatter, params, rest, sinks, r, a, positions)

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
def _stack(graphdef, layout, setup, scatter, params, rest, sinks, r, a, positions):
    return _forward(graphdef, layout, params, rest, r, a, positions)[0]


def _forward(graphdef, layout, params, rest, r, a, positions):
    layer = _layer(graphdef, layout, positions)

    def body(carry, xs):
        (r_out, a_out), stats = layer(*xs, *carry)
        return (r_out, a_out), (carry, stats)

    (r, _), (inputs, stats) = jax.lax.scan(body, (r, a), (params, rest))
    return (r, stats), inputs


def _stack_fwd(graphdef, layout, setup, scatter, params, rest, sinks, r, a, positions):
    out, inputs = _forward(graphdef, layout, params, rest, r, a, positions)
    return out, (params, rest, sinks, inputs, positions)


def _stack_bwd(graphdef, layout, setup, scatter, res, cotangents):
    params, rest, sinks, (r_in, a_in), positions = res
    layer = _layer(graphdef, layout, positions)
    num_layers = r_in.shape[0]

    def into(piece: int):
        def body(carry, xs):
            dr, da, sinks = carry
            index, r, a = xs
            p, q = _at(params, index), _at(rest, index)
            _, pull, _ = jax.vjp(lambda p_, r_, a_: layer(p_, q, r_, a_), p, r, a, has_aux=True)
            dp, dr, da = pull((dr, da))
            grads = {f"{LAYERS}/{path_name(k)}": g for k, g in jax.tree_util.tree_leaves_with_path(dp)}
            return (dr, da, _add_layer(setup, sinks, grads, index, piece)), None

        return body

    carry = (cotangents[0], jnp.zeros_like(a_in[0]), sinks)
    if scatter is None:  # the layers of slot buffer P - 1 first, then P - 2, ... (`layout.sink_pieces`)
        pieces = sink_pieces(setup.layout)
        k = num_layers // pieces
        for piece in reversed(range(pieces)):
            xs = (piece * k + jnp.arange(k), *(x[piece * k : (piece + 1) * k] for x in (r_in, a_in)))
            carry, _ = jax.lax.scan(into(piece), carry, xs, reverse=True)
        dr, da, sinks = carry
        return None, None, sinks, dr, da, None
    body, init = into(0), carry
    chunks = max(g.slots.chunks for g in setup.layout.groups)
    k = num_layers // chunks

    def chunk_backward(carry, c):
        # the chunk's k <= OVERLAP_CHUNK_LAYERS layers unrolled, so that their GEMMs sit in the chunk loop's own
        # body beside the pending reduce-scatter, where the GPU schedule overlaps them (docs/parallelism.md)
        layers = c * k + jnp.arange(k)
        inputs = (jax.lax.dynamic_slice_in_dim(x, c * k, k) for x in (r_in, a_in))  # no copy of the stack
        return jax.lax.scan(body, carry, (layers, *inputs), reverse=True, unroll=True)[0]

    def chunk(carry, c):
        grads, pending = carry
        # chunk c + 1's rows were summed in the previous iteration: their reduce-scatter is independent of
        # this chunk's backward, so the scheduler can run it under this chunk's GEMMs (software pipelining)
        parts = _scatter(setup, pending)
        dr, da, sinks = chunk_backward(grads, c)
        # written back after the backward (whose sink updates then need not wait for the scatter); chunk c's
        # rows are read after that write, so XLA cannot merge the two reduce-scatters into one
        sinks = _write_owned(setup, sinks, parts, c + 1)
        return ((dr, da, sinks), _chunk_rows(setup, sinks, c, scatter)), None

    last = chunks - 1
    dr, da, sinks = chunk_backward(init, last)
    pending = _chunk_rows(setup, sinks, last, scatter)
    ((dr, da, sinks), pending), _ = jax.lax.scan(chunk, ((dr, da, sinks), pending), jnp.arange(last), reverse=True)
    return None, None, _write_owned(setup, sinks, _scatter(setup, pending), 0), dr, da, None


def _chunk_rows(setup: Zero1Setup, sinks: Sinks, chunk: jax.Array, dtype) -> tuple:
    """Per group, this device's (un-reduced) sink rows of layer chunk `chunk` in `dtype` ([n·s_c, S]), or None
    for a group without Muon matrices."""
    rows = []
    for group, (buf,) in zip(setup.layout.groups, sinks.slots):  # one slot buffer (`layout.sink_pieces`)
        s = group.slots
        at = (chunk * s.chunk_rows, 0)
        rows.append(jax.lax.dynamic_slice(buf, at, (s.chunk_rows, s.bin_size)).astype(dtype) if s.num_bins else None)
    return tuple(rows)


def _scatter(setup: Zero1Setup, rows: tuple) -> tuple:
    """Per group, the group-wide sums of `rows` (`_chunk_rows`) that this device owns ([s_c, S]; one
    reduce-scatter per group)."""
    return tuple(
        None if part is None else jax.lax.psum_scatter(part, group.axes, scatter_dimension=0, tiled=True)
        for group, part in zip(setup.layout.groups, rows)
    )


def _write_owned(setup: Zero1Setup, sinks: Sinks, parts: tuple, chunk) -> Sinks:
    """sinks with `parts` (`_scatter`) over the first s_c rows of layer chunk `chunk`'s rows (`owned_rows`)."""
    slots = tuple(
        (
            buf
            if part is None
            else jax.lax.dynamic_update_slice(buf, part.astype(buf.dtype), (chunk * g.slots.chunk_rows, 0)),
        )
        for g, (buf,), part in zip(setup.layout.groups, sinks.slots, parts)
    )
    return Sinks(slots, sinks.small)


_stack.defvjp(_stack_fwd, _stack_bwd)
