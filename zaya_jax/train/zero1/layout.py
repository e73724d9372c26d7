"""The ZeRO-1 owner layout (arXiv 2511.17127 §2; docs/parallelism.md): which device owns which parameter's
optimizer work, and how gradients and weights are packed for the step's reduce-scatter and all-gather.

Parameters replicated over the same devices form a `Group` (per group: the devices `axes`, and `outer`, the
axes that split its parameters, e.g. `expert` for the routed experts under expert parallelism). Each group
has two layouts (`zaya_jax.train.zero1.owners`): Muon matrices in owner *slots* [n·s, S] (n devices, s slots of
S elements each; every matrix in exactly one slot, so one device orthogonalises it) and the elementwise AdamW
leaves *flat* [n·C].

`pack_*` / `unpack_*` move between parameter-shaped trees and the layouts. On one device's local arrays
(inside the train step's `shard_map`, `zaya_jax.train.zero1.step`) they build the reduce-scatter input and read
the all-gather output; on global arrays (`*_global`) they convert whole states (`zaya_jax.train.zero1.state`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zaya_jax.keys import path_name
from zaya_jax.model.layers import dtype_of
from zaya_jax.model.zaya import STACKED_AXIS
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES
from zaya_jax.train import optimizer as optimizer_lib
from zaya_jax.train.zero1.owners import FlatLayout, Matrix, SlotLayout, overlap_chunks, update_chunks

Arrays = dict[str, jax.Array]  # parameter path name → array


@dataclasses.dataclass(frozen=True)
class Group:
    """Parameters replicated over `axes` (the devices that split their optimizer work) and split over `outer`."""

    axes: tuple[str, ...]
    outer: tuple[str, ...]
    num_outer: int
    slots: SlotLayout
    flat: FlatLayout

    def spec(self, ndim: int) -> P:
        """Spec of the group's state arrays, slots [O, n·s, S] and flat [O, n·C]: dim 1 over the group's devices."""
        return P(self.outer or None, self.axes, *([None] * (ndim - 2)))


@dataclasses.dataclass(frozen=True)
class Zero1Layout:
    groups: tuple[Group, ...]
    specs: dict  # name → parameter PartitionSpec
    shapes: dict  # name → global shape
    compute_dtype: Any
    param_dtype: Any
    # the slots' layer chunks are reduce-scattered inside the last backward pass (`train.overlap_collectives`);
    # else, with C > 1 chunks, after it chunk by chunk (`layer_chunks`)
    scatter_in_backward: bool = False

    def local_shape(self, name: str, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(
            d // math.prod(sizes[a] for a in _axes_of(e))
            for d, e in zip(self.shapes[name], list(self.specs[name]) + [None] * len(self.shapes[name]))
        )


def _axes_of(entry) -> tuple[str, ...]:
    return () if entry is None else (entry if isinstance(entry, tuple) else (entry,))


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    """[(path name, leaf)] of a parameter-shaped tree (NNX variables unwrapped to their values)."""
    return [(path_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def fill(template: Any, values: Arrays) -> Any:
    """`template` (parameter-shaped, e.g. an nnx.State) with every leaf replaced by `values[its name]`."""
    return jax.tree_util.tree_map_with_path(lambda p, _: values[path_name(p)], template)


def _matrices(name: str, shape: tuple[int, ...], split: bool) -> list[Matrix]:
    *lead, rows, cols = shape[1:]
    halves = (0, 1) if split else (None,)
    return [Matrix(name, idx, rows, cols // 2 if split else cols, h) for idx in np.ndindex(*lead) for h in halves]


def build_layout(config: ml_collections.ConfigDict, mesh: Mesh, abs_params: Any) -> Zero1Layout:
    """Owner layouts of every group for `abs_params` (an abstract nnx.State of the model's parameters)."""
    o, sizes = config.optimizer, dict(mesh.shape)
    labels = dict(named_leaves(optimizer_lib.param_labels(abs_params, muon_conv=bool(o.muon_conv))))
    decay = dict(
        named_leaves(
            optimizer_lib.decay_mask(abs_params, decay_embedding=bool(o.decay_embedding), muon_conv=bool(o.muon_conv))
        )
    )
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    specs, shapes, members = {}, {}, {}
    for path, var in jax.tree_util.tree_flatten_with_path(abs_params, is_leaf=is_var)[0]:
        name, shape = path_name(path), tuple(var.get_value().shape)
        names = sharding.logical_axes(var, name)
        specs[name], shapes[name] = sharding.param_spec(names, shape, mesh, "zero1"), shape
        outer = tuple(a for e in specs[name] for a in _axes_of(e))
        members.setdefault(outer, []).append((name, names))
    layout = Zero1Layout((), specs, shapes, dtype_of(config.model.dtype), dtype_of(config.model.param_dtype))
    groups = []
    for outer, leaves in members.items():
        axes = tuple(a for a in AXES if a not in outer)
        n = math.prod(sizes[a] for a in axes)
        matrices, flat, layers = [], [], None
        for name, names in leaves:
            local = layout.local_shape(name, sizes)
            if labels[name] == "muon":
                if names[0] != STACKED_AXIS or len(local) < 3:
                    raise ValueError(f"Muon parameter {name} {local} must be a per-layer stack of matrices")
                layers = local[0]
                split = bool(o.muon_split_gate_up) and leaf_name_of(name) == optimizer_lib.SPLIT_LEAF
                matrices += _matrices(name, local, split)
            else:
                flat.append((name, math.prod(local), bool(decay[name])))
        groups.append(
            Group(
                axes,
                outer,
                math.prod(sizes[a] for a in outer),
                SlotLayout.build(matrices, layers or 0, n),
                FlatLayout.build(flat, n),
            )
        )
    chunks, in_backward = layer_chunks(config, groups)
    if chunks > 1:
        groups = [dataclasses.replace(g, slots=_chunked(g.slots, chunks)) for g in groups]
    return dataclasses.replace(layout, groups=tuple(groups), scatter_in_backward=in_backward)


def layer_chunks(config: ml_collections.ConfigDict, groups: list[Group]) -> tuple[int, bool]:
    """(C layer chunks of the owner layouts, whether the backward pass reduce-scatters them;
    `zaya_jax.train.zero1.owners`): with `train.overlap_collectives` (and `model.remat=full`) the chunks the
    backward layer loop reduce-scatters (`owners.overlap_chunks`) where there are any; else, with
    `train.pipeline_update`, the chunks the update pipelines after the backward (`owners.update_chunks`, no
    extra padding); else 1."""
    with_slots = [g.slots for g in groups if g.slots.num_bins]
    if not with_slots:
        return 1, False
    shape = (
        tuple(s.bins_per_layer for s in with_slots),
        tuple(s.devices for s in with_slots),
        with_slots[0].num_layers,
    )
    if config.train.overlap_collectives and config.model.remat == "full" and (chunks := overlap_chunks(*shape)) > 1:
        return chunks, True
    return (update_chunks(*shape) if config.train.pipeline_update else 1), False


def _chunked(slots: SlotLayout, chunks: int) -> SlotLayout:
    return dataclasses.replace(slots, chunks=chunks) if slots.num_bins else slots


def leaf_name_of(name: str) -> str:
    return name.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- local pack / unpack


def layer_bins(slots: SlotLayout, layer_leaves: Arrays, dtype) -> jax.Array:
    """One layer's B bins [B, S] in `dtype` from that layer's (local) leaves {name: [...]} (no [L] axis)."""
    rows = []
    for segments in slots.bins:
        parts = []
        for seg in segments:
            m = seg.matrix
            x = layer_leaves[m.leaf][m.index]  # [rows, cols (× 2 when split)]
            if m.half is not None:
                x = x[..., m.half * m.cols : (m.half + 1) * m.cols]
            parts.append(x.reshape(m.size).astype(dtype))
        used = sum(seg.matrix.size for seg in segments)
        if used < slots.bin_size:
            parts.append(jnp.zeros((slots.bin_size - used,), dtype))
        rows.append(jnp.concatenate(parts) if len(parts) > 1 else parts[0])
    return jnp.stack(rows)


def pack_slots(
    slots: SlotLayout, leaves: Arrays, dtype, acc: tuple[jax.Array, ...] | None = None, pieces: int = 1
) -> tuple[jax.Array, ...]:
    """Muon matrices of one group (local, stacked [L, ...] leaves) → owner slots [n·s, S] in `dtype`, kept as
    `pieces` separate buffers of [n·s / P, S] (`sink_pieces`: one per layer chunk, or one).

    Written layer by layer (a layer's bins are contiguous rows, `piece_row`), so nothing bigger than one layer's
    bins is built on the side; with `acc` (the pieces) the layer's bins are added to it in place. The rows are
    in the packed (chunk-major) order; `owned_order` gives the owners'."""
    if not slots.num_bins:
        return (jnp.zeros((0, 0), dtype),)
    per, size, k = slots.bins_per_layer, slots.bin_size, slots.num_layers // pieces
    bufs = zero_pieces(slots, pieces, dtype) if acc is None else acc
    names = {seg.matrix.leaf for b in slots.bins for seg in b}

    def into(p):
        def layer(l, buf):
            layer_leaves = {n: jax.lax.dynamic_index_in_dim(leaves[n], l, keepdims=False) for n in names}
            rows, at = layer_bins(slots, layer_leaves, dtype), (piece_row(slots, l, p, pieces), 0)
            if acc is not None:
                rows = rows + jax.lax.dynamic_slice(buf, at, (per, size))
            return jax.lax.dynamic_update_slice(buf, rows, at)

        return layer

    return tuple(jax.lax.fori_loop(p * k, (p + 1) * k, into(p), buf) for p, buf in enumerate(bufs))


def zero_pieces(slots: SlotLayout, pieces: int, dtype) -> tuple[jax.Array, ...]:
    """Zero packed slots [n·s, S] as `pieces` buffers of [n·s / P, S] (one [0, 0] without Muon matrices)."""
    if not slots.num_bins:
        return (jnp.zeros((0, 0), dtype),)
    return tuple(jnp.zeros((slots.rows // pieces, slots.bin_size), dtype) for _ in range(pieces))


def sink_pieces(layout: Zero1Layout) -> int:
    """P: separate buffers the step keeps each group's packed slots in. One per layer chunk where the chunks are
    reduce-scattered after the backward pass (each chunk's scatter then takes a whole buffer: a slice of one
    buffer would be a copy on a GPU); one where the backward pass scatters them (it indexes the chunk) or
    without chunks."""
    chunks = max(g.slots.chunks for g in layout.groups)
    return 1 if layout.scatter_in_backward else chunks


def piece_row(slots: SlotLayout, layer, piece, pieces: int):
    """First row of layer `layer`'s B bins in piece `piece` of `pieces` (`sink_pieces`; traced ints allowed)."""
    return slots.layer_row(layer) - piece * (slots.rows // pieces)


def unpack_slots(
    slots: SlotLayout, pieces: tuple[jax.Array, ...], shapes: dict[str, tuple[int, ...]], into: Arrays | None = None
) -> Arrays:
    """Inverse of `pack_slots`: the packed rows chunk by chunk (C × [n·s_c, S]; one [n·s, S] without chunks) →
    {name: [L, ...] local leaf} in the dtype of the rows, written chunk by chunk, layer by layer into `into`'s
    arrays (e.g. the donated previous parameters, updated in place) or into zeros. Chunk c's layers read only
    chunk c's rows."""
    if not slots.num_bins:
        return {}
    per, size, k = slots.bins_per_layer, slots.bin_size, slots.layers_per_chunk
    names = list(dict.fromkeys(seg.matrix.leaf for b in slots.bins for seg in b))
    dtype = pieces[0].dtype
    out = {n: (into[n].astype(dtype) if into is not None else jnp.zeros(shapes[n], dtype)) for n in names}

    def layer(rows, first):
        def write(l, out):
            bins = jax.lax.dynamic_slice(rows, ((l - first) * per, 0), (per, size))
            parts: dict[str, dict] = {}
            for i, segments in enumerate(slots.bins):
                for seg in segments:
                    m = seg.matrix
                    parts.setdefault(m.leaf, {})[(m.index, m.half)] = bins[i, seg.offset : seg.offset + m.size].reshape(
                        m.rows, m.cols
                    )
            new = {}
            for name in names:
                lead = shapes[name][1:-2]
                mats = [
                    parts[name][(idx, None)]
                    if (idx, None) in parts[name]
                    else jnp.concatenate([parts[name][(idx, 0)], parts[name][(idx, 1)]], axis=-1)
                    for idx in np.ndindex(*lead)
                ]
                layer_value = jnp.stack(mats).reshape(shapes[name][1:])
                new[name] = jax.lax.dynamic_update_index_in_dim(out[name], layer_value, l, 0)
            return new

        return write

    for c, rows in enumerate(pieces):
        out = jax.lax.fori_loop(c * k, (c + 1) * k, layer(rows, c * k), out)
    return out


def by_chunk(rows: jax.Array, chunks: int) -> tuple[jax.Array, ...]:
    """Rows chunk-major ([C·r, ...]: packed [C·n·s_c, S] or owned [C·s_c, S]) → C × [r, ...] (`rows` itself
    for one chunk or none), as `unpack_slots` and the step's collectives take them."""
    return (rows,) if chunks == 1 or not rows.size else tuple(jnp.split(rows, chunks))


def owned_order(slots: SlotLayout, packed: jax.Array) -> jax.Array:
    """Packed rows [C·n·s_c, ...] (chunk-major) → the owners' order [n·C·s_c, ...] (device d's rows
    [d·s, (d+1)·s)), as the state's slot arrays hold them. The identity for one chunk."""
    if slots.chunks == 1 or not slots.num_bins:
        return packed
    x = packed.reshape(slots.chunks, slots.devices, slots.chunk_slots, *packed.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape(packed.shape)


def packed_order(slots: SlotLayout, owned: jax.Array) -> jax.Array:
    """Inverse of `owned_order`."""
    if slots.chunks == 1 or not slots.num_bins:
        return owned
    x = owned.reshape(slots.devices, slots.chunks, slots.chunk_slots, *owned.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape(owned.shape)


def pack_flat(flat: FlatLayout, leaves: Arrays, dtype) -> jax.Array:
    """Elementwise leaves of one group (local) → [n·C] in `dtype` (decayed leaves first, zero padding)."""
    if not flat.size:
        return jnp.zeros((0,), dtype)
    parts = [leaves[name].reshape(-1).astype(dtype) for name, _ in flat.leaves]
    return jnp.pad(jnp.concatenate(parts), (0, flat.padded - flat.size))


def unpack_flat(flat: FlatLayout, vec: jax.Array, shapes: dict[str, tuple[int, ...]]) -> Arrays:
    out, start = {}, 0
    for name, size in flat.leaves:
        out[name] = vec[start : start + size].reshape(shapes[name])
        start += size
    return out


def local_shapes(layout: Zero1Layout, group: Group, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
    names = [s.matrix.leaf for b in group.slots.bins for s in b] + [n for n, _ in group.flat.leaves]
    return {n: layout.local_shape(n, sizes) for n in names}


# ----------------------------------------------------------------------------- global conversions


def _split_outer(layout: Zero1Layout, name: str, x: jax.Array, group: Group) -> jax.Array:
    """Global leaf → [O, *local shape]: its `outer`-sharded dimension split into O blocks moved to the front."""
    if not group.outer:
        return x[None]
    dim = next(d for d, e in enumerate(layout.specs[name]) if _axes_of(e))
    shape = list(x.shape)
    x = x.reshape(*shape[:dim], group.num_outer, shape[dim] // group.num_outer, *shape[dim + 1 :])
    return jnp.moveaxis(x, dim, 0)


def _merge_outer(layout: Zero1Layout, name: str, x: jax.Array, group: Group) -> jax.Array:
    if not group.outer:
        return x[0]
    dim = next(d for d, e in enumerate(layout.specs[name]) if _axes_of(e))
    x = jnp.moveaxis(x, 0, dim)
    return x.reshape(*x.shape[:dim], x.shape[dim] * x.shape[dim + 1], *x.shape[dim + 2 :])


def pack_global(
    layout: Zero1Layout, sizes: dict[str, int], values: Arrays, dtype=jnp.float32
) -> tuple[tuple[jax.Array, jax.Array], ...]:
    """Global parameter-shaped arrays → per group (slots [O, n·s, S] in the owners' order, flat [O, n·C])."""
    out = []
    for group in layout.groups:
        shapes = local_shapes(layout, group, sizes)
        split = {n: _split_outer(layout, n, values[n], group) for n in shapes}
        slots = jax.vmap(lambda v: owned_order(group.slots, pack_slots(group.slots, v, dtype)[0]))(split)
        flat = jax.vmap(lambda v: pack_flat(group.flat, v, dtype))(split)
        out.append((slots, flat))
    return tuple(out)


def unpack_global(layout: Zero1Layout, sizes: dict[str, int], packed) -> Arrays:
    """Inverse of `pack_global` (dtype of the packed arrays)."""
    values: Arrays = {}
    for group, (slots, flat) in zip(layout.groups, packed):
        shapes = local_shapes(layout, group, sizes)
        parts = jax.vmap(
            lambda s, f: {
                **unpack_slots(group.slots, by_chunk(packed_order(group.slots, s), group.slots.chunks), shapes),
                **unpack_flat(group.flat, f, shapes),
            }
        )(slots, flat)
        values.update({n: _merge_outer(layout, n, x, group) for n, x in parts.items()})
    return values
