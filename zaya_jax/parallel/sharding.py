"""The one place that maps logical axes to mesh axes: parameters, optimizer state and activations.

Every parameter carries logical axis names from where it is created (`zaya_jax.model.layers.param`), e.g.
the routed-expert kernel `layers/moe/w_in` is ("layers", "experts", "embed", "mlp_gate_up"). `PARAM_AXIS_RULES`
lists every logical name once with the mesh axes it is split over (`RULES`: the same table per rule set); a name
without a rule is replicated, an unknown name or a parameter without names is an error.

* params, `zero1` (the paper's scheme, arXiv 2511.17127 §2) and `replicated`: replicated, except routed
  experts split over `expert` (expert parallelism, when that axis is > 1);
* params, `fsdp`: additionally the hidden (`embed`) dimension over `data`;
* optimizer state in the per-parameter layout (`fsdp` / `replicated` steps, and checkpoints of every mode):
  the parameter's spec, then — except for `replicated` — every remaining mesh axis on the first dimension it
  divides (leading dimensions first, then the larger matrix dimension), so the state of a large leaf is never
  replicated. The ZeRO-1 step keeps its optimizer state in an owner layout instead (`zaya_jax.train.zero1`);
* activations: batch over (`data`, `expert`), sequence over `context`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax.config import PARAM_SHARDINGS
from zaya_jax.keys import path_name
from zaya_jax.parallel.mesh import AXES, BATCH_AXES, active_mesh, in_manual_region

# Every logical axis a parameter may carry, with the mesh axes it is split over per rule set ("param": the
# `zero1` and `replicated` modes; "fsdp"); a rule set that does not name the axis replicates it.
PARAM_AXIS_RULES: dict[str, dict[str, tuple[str, ...]]] = {
    "layers": {},
    "vocab": {},
    "embed": {"fsdp": ("data",)},
    "q_heads": {},
    "kv_heads": {},
    "kv_half": {},
    "kv_groups": {},
    "conv_taps": {},
    "qk": {},
    "qk_groups": {},
    "head_in": {},
    "head_out": {},
    "router": {},
    "router_out": {},
    "classes": {},
    "experts": {"param": ("expert",), "fsdp": ("expert",)},
    "mlp": {},
    "mlp_gate_up": {},
}
LOGICAL_AXES = frozenset(PARAM_AXIS_RULES)
# rule set → {logical axis: mesh axes}, the parameter sets derived from the table above
RULES: dict[str, dict[str, tuple[str, ...]]] = {
    **{
        rule_set: {name: rules[rule_set] for name, rules in PARAM_AXIS_RULES.items() if rule_set in rules}
        for rule_set in ("param", "fsdp")
    },
    "activation": {"batch": BATCH_AXES, "seq": ("context",)},
}
PARAM_MODES = PARAM_SHARDINGS  # `train.param_sharding` names


def logical_axes(var: nnx.Variable, where: str = "") -> tuple[str | None, ...]:
    """The logical axis names a parameter was created with; an unnamed or unknown axis is an error."""
    names = var.get_metadata().get("out_sharding")
    if names is None or len(names) != len(getattr(var.get_value(), "shape", ())):
        raise ValueError(
            f"parameter {where or var!r} has no logical axis names for its shape; create it with "
            "zaya_jax.model.layers.param(value, axes)"
        )
    unknown = [n for n in names if n is not None and n not in LOGICAL_AXES]
    if unknown:
        raise ValueError(
            f"parameter {where}: unknown logical axes {unknown}; add them to "
            "zaya_jax.parallel.sharding.PARAM_AXIS_RULES (with a rule if they should be split)"
        )
    return tuple(names)


def _mesh_size(mesh: Mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def param_spec(names: tuple, shape: tuple[int, ...], mesh: Mesh, mode: str) -> P:
    """PartitionSpec of a parameter with logical `names` under `RULES` for `mode` (a rule whose mesh axes
    have size 1, or that does not divide the dimension, leaves the dimension replicated)."""
    rules = RULES["fsdp" if mode == "fsdp" else "param"]
    spec = []
    for name, dim in zip(names, shape):
        axes = tuple(a for a in rules.get(name, ()) if mesh.shape[a] > 1)
        ok = axes and dim % _mesh_size(mesh, axes) == 0
        spec.append((axes[0] if len(axes) == 1 else axes) if ok else None)
    return P(*spec)


def spread_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """`spec` plus every unused mesh axis (size > 1) on the first dimension that stays divisible: leading
    dimensions first, then the matrix dimensions larger first (per-parameter optimizer state, ZeRO-style)."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    used = {a for e in entries if e for a in (e if isinstance(e, tuple) else (e,))}
    order = list(range(max(0, len(shape) - 2))) + sorted(
        range(max(0, len(shape) - 2), len(shape)), key=lambda d: -shape[d]
    )
    for axis in AXES:
        if axis in used or mesh.shape[axis] == 1:
            continue
        for dim in order:
            current = entries[dim] if entries[dim] else ()
            current = current if isinstance(current, tuple) else (current,)
            if shape[dim] % (_mesh_size(mesh, current) * mesh.shape[axis]) == 0:
                entries[dim] = (*current, axis) if current else axis
                break
    return P(*entries)


def tree_specs(tree: Any, mesh: Mesh, mode: str, kind: str = "param") -> Any:
    """PartitionSpecs for a tree of parameters (`kind='param'`) or per-parameter optimizer state
    (`kind='opt'`), same structure (NNX variables keep their metadata, their value becomes the spec).
    Scalars (step counts) are replicated; any other leaf that is not a named parameter is an error."""
    if mode not in PARAM_MODES:
        raise ValueError(f"param_sharding={mode!r}; choose one of {PARAM_MODES}")
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731

    def spec(path, leaf):
        if not is_var(leaf):
            if getattr(leaf, "shape", ()):
                raise ValueError(f"{kind} leaf {path_name(path)} is not a named parameter: no sharding rule for it")
            return P()
        if not hasattr(leaf.get_value(), "shape"):  # e.g. optax.MaskedNode: this group does not update it
            return leaf
        shape = tuple(leaf.get_value().shape)
        s = param_spec(logical_axes(leaf, path_name(path)), shape, mesh, mode)
        if kind == "opt" and mode != "replicated":
            s = spread_spec(s, shape, mesh)
        return leaf.replace(value=s)

    return jax.tree_util.tree_map_with_path(spec, tree, is_leaf=is_var)


def named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def batch_spec(ndim: int = 2) -> P:
    """Batch arrays [B, S, ...]: B over (data, expert), S over context (`RULES['activation']`)."""
    rules = RULES["activation"]
    return P(rules["batch"], *rules["seq"], *([None] * (ndim - 2)))


def token_spec() -> P:
    """Flattened tokens [B·S, ...] (see `flatten_tokens`: one block per device, in order data, expert, context)."""
    return P((*BATCH_AXES, "context"))


def _token_blocks(batch: int, seq: int) -> tuple[int, int] | None:
    """(batch shards, context shards) when the active mesh splits the sequence (context > 1) and both divide."""
    mesh = active_mesh()
    if mesh is None or in_manual_region() or mesh.shape["context"] == 1:
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
    """Pin an activation [B, S, ...] to the batch layout under a GSPMD mesh (no-op without one or per device)."""
    if active_mesh() is None or in_manual_region():
        return x
    return jax.lax.with_sharding_constraint(x, batch_spec(x.ndim))
