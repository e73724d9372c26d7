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
from zaya_jax.train.zero1.owners import FlatLayout, Matrix, SlotLayout, overlap_chunks

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
    chunks = layer_chunks(config, groups)
    if chunks > 1:
        groups = [dataclasses.replace(g, slots=_chunked(g.slots, chunks)) for g in groups]
    return dataclasses.replace(layout, groups=tuple(groups))


def layer_chunks(config: ml_collections.ConfigDict, groups: list[Group]) -> int:
    """C layer chunks of the owner layouts: > 1 only when the step reduce-scatters inside the backward layer
    loop (`train.overlap_collectives` with `model.remat=full`, `zaya_jax.train.zero1.fused_backward`) and some chunking
    costs little padding (`owners.overlap_chunks`)."""
    with_slots = [g.slots for g in groups if g.slots.num_bins]
    if not (config.train.overlap_collectives and config.model.remat == "full" and with_slots):
        return 1
    return overlap_chunks(
        tuple(s.bins_per_layer for s in with_slots), tuple(s.devices for s in with_slots), with_slots[0].num_layers
    )


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


def pack_slots(slots: SlotLayout, leaves: Arrays, dtype, acc: jax.Array | None = None) -> jax.Array:
    """Muon matrices of one group (local, stacked [L, ...] leaves) → owner slots [n·s, S] in `dtype`.

    Written layer by layer into one buffer (a layer's bins are contiguous rows, from `slots.layer_row`), so
    nothing bigger than one layer's bins is built on the side; with `acc` [n·s, S] the layer's bins are added
    to it in place. The result is in the packed (chunk-major) order; `owned_order` gives the owners'."""
    if not slots.num_bins:
        return jnp.zeros((0, 0), dtype)
    per, size = slots.bins_per_layer, slots.bin_size
    buf = jnp.zeros((slots.rows, size), dtype) if acc is None else acc

    names = {seg.matrix.leaf for b in slots.bins for seg in b}

    def layer(l, buf):
        rows = layer_bins(slots, {n: jax.lax.dynamic_index_in_dim(leaves[n], l, keepdims=False) for n in names}, dtype)
        if acc is not None:
            rows = rows + jax.lax.dynamic_slice(buf, (slots.layer_row(l), 0), (per, size))
        return jax.lax.dynamic_update_slice(buf, rows, (slots.layer_row(l), 0))

    return jax.lax.fori_loop(0, slots.num_layers, layer, buf)


def unpack_slots(
    slots: SlotLayout, rows: jax.Array, shapes: dict[str, tuple[int, ...]], into: Arrays | None = None
) -> Arrays:
    """Inverse of `pack_slots`: [n·s, S] → {name: [L, ...] local leaf} in the dtype of `rows`, written layer by
    layer into `into`'s arrays (e.g. the donated previous parameters, updated in place) or into zeros."""
    if not slots.num_bins:
        return {}
    per, size = slots.bins_per_layer, slots.bin_size
    names = list(dict.fromkeys(seg.matrix.leaf for b in slots.bins for seg in b))
    out = {n: (into[n].astype(rows.dtype) if into is not None else jnp.zeros(shapes[n], rows.dtype)) for n in names}

    def layer(l, out):
        bins = jax.lax.dynamic_slice(rows, (slots.layer_row(l), 0), (per, size))
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

    return jax.lax.fori_loop(0, slots.num_layers, layer, out)


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
        slots = jax.vmap(lambda v: owned_order(group.slots, pack_slots(group.slots, v, dtype)))(split)
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
                **unpack_slots(group.slots, packed_order(group.slots, s), shapes),
                **unpack_flat(group.flat, f, shapes),
            }
        )(slots, flat)
        values.update({n: _merge_outer(layout, n, x, group) for n, x in parts.items()})
    return values
