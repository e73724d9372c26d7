"""The one place that maps parameters, optimizer state and activations to mesh axes.

Parameters (logical axis names from their path):
* `zero1` (the paper's scheme) and `replicated`: everything replicated over `data`/`context`;
  routed-expert weights sharded over `expert` on their expert dimension.
* `fsdp`: additionally shard each parameter over `data` (largest divisible dimension).

Optimizer state (`zero1`, `fsdp`): every leaf sharded across *all* devices when a dimension divides:
leading batch dimensions (layers, experts) first, so Muon's Newton–Schulz runs on whole matrices
that one device owns (no gather inside the orthogonalisation), then the matrix dimensions.

Activations: batch over (`data`, `expert`), sequence over `context`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zaya_jax.parallel.mesh import AXES, BATCH_AXES

EXPERT_LEAVES = ("w_in", "w_out")  # [L, E, ...] routed-expert kernels


def _path_names(path) -> list[str]:
    """Key names along a pytree path, without the `.value` attribute of NNX variables."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
    return [n for n in names if n not in ("value", "raw_value")]


def _is_expert_leaf(path, ndim: int) -> bool:
    names = _path_names(path)
    return bool(names) and names[-1] in EXPERT_LEAVES and "layers" in names and ndim == 4


def _shard_free_axes(shape: tuple[int, ...], spec: list, mesh: Mesh, axes: tuple[str, ...],
                     order: list[int]) -> list:
    """Assign each still-unused mesh axis in `axes` (size > 1) to a dimension (in `order` of preference)
    that stays divisible; returns the updated spec list."""
    used = {a for entry in spec if entry for a in (entry if isinstance(entry, tuple) else (entry,))}
    for axis in axes:
        if axis in used or mesh.shape[axis] == 1:
            continue
        for dim in order:
            current = spec[dim] if spec[dim] else ()
            current = current if isinstance(current, tuple) else (current,)
            split = math.prod(mesh.shape[a] for a in current) * mesh.shape[axis]
            if shape[dim] % split == 0:
                spec[dim] = (*current, axis) if current else axis
                break
    return spec


def param_spec(path, shape: tuple[int, ...], mesh: Mesh, mode: str) -> P:
    """PartitionSpec of one parameter. Expert kernels [L, E, ...]: E over `expert`."""
    spec: list = [None] * len(shape)
    if _is_expert_leaf(path, len(shape)) and mesh.shape["expert"] > 1:
        spec[1] = "expert"
    if mode == "fsdp":
        order = sorted(range(len(shape)), key=lambda d: -shape[d])
        spec = _shard_free_axes(shape, spec, mesh, ("data",), order)
    return P(*spec)


def opt_state_spec(path, shape: tuple[int, ...], mesh: Mesh, mode: str) -> P:
    """PartitionSpec of an optimizer-state leaf shaped like its parameter (ZeRO-1: over all devices)."""
    spec = list(param_spec(path, shape, mesh, mode)) + [None] * 0
    spec += [None] * (len(shape) - len(spec))
    if mode == "replicated" or not shape:
        return P(*spec)
    batch_dims = list(range(max(0, len(shape) - 2)))
    matrix_dims = sorted(range(max(0, len(shape) - 2), len(shape)), key=lambda d: -shape[d])
    spec = _shard_free_axes(shape, spec, mesh, AXES, batch_dims + matrix_dims)
    return P(*spec)


def tree_specs(tree: Any, mesh: Mesh, mode: str, kind: str = "param") -> Any:
    """PartitionSpecs for every array leaf of `tree` (params, or optimizer state with `kind='opt'`)."""
    rule = param_spec if kind == "param" else opt_state_spec

    def spec(path, leaf):
        shape = tuple(getattr(leaf, "shape", ()))
        return rule(path, shape, mesh, mode) if shape else P()

    return jax.tree_util.tree_map_with_path(spec, tree)


def named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def batch_spec(ndim: int = 2) -> P:
    """Batch arrays [B, S, ...]: B over (data, expert), S over context."""
    return P(BATCH_AXES, "context", *([None] * (ndim - 2)))


def token_spec() -> P:
    """Flattened tokens [B·S, ...] (see `flatten_tokens`: one block per device, in order data, expert, context)."""
    return P((*BATCH_AXES, "context"))


def _token_blocks(batch: int, seq: int) -> tuple[int, int] | None:
    """(batch shards, context shards) when the active mesh splits the sequence (context > 1) and both divide."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names) or mesh.shape["context"] == 1:
        return None
    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if batch % shards or seq % mesh.shape["context"]:
        return None
    return shards, mesh.shape["context"]


def flatten_tokens(x: jax.Array) -> jax.Array:
    """[B, S, ...] in the batch layout → [B·S, ...] sharded like `token_spec()`, without moving data.

    With a `context` axis > 1 and B_l = B / (data·expert) > 1 a row-major reshape would interleave
    devices' tiles and force a reshard (an all-gather of the activations); here each device's [B_l, S_l]
    tile becomes one contiguous block instead. Identical to `x.reshape(B·S, ...)` when context = 1 or B_l = 1.
    """
    b, s, *rest = x.shape
    blocks = _token_blocks(b, s)
    if blocks is None:
        return x.reshape(b * s, *rest)
    de, c = blocks
    y = x.reshape(de, b // de, c, s // c, *rest).swapaxes(1, 2)
    return y.reshape(b * s, *rest)


def unflatten_tokens(y: jax.Array, batch: int, seq: int) -> jax.Array:
    """Inverse of `flatten_tokens`: [B·S, ...] → [B, S, ...]."""
    rest = y.shape[1:]
    blocks = _token_blocks(batch, seq)
    if blocks is None:
        return y.reshape(batch, seq, *rest)
    de, c = blocks
    y = y.reshape(de, c, batch // de, seq // c, *rest).swapaxes(1, 2)
    return y.reshape(batch, seq, *rest)


def constrain_batch(x: jax.Array) -> jax.Array:
    """Pin an activation [B, S, ...] to the batch layout when a mesh is active (no-op otherwise)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, batch_spec(x.ndim))
