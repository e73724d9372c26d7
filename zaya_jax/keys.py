"""Names of pytree leaves: the one place that turns a JAX key path into a readable parameter name.

Parameters, optimizer state, checkpoints and the planner all name a leaf the same way:
`path_name(path)` → ``"layers/moe/w_in"`` (NNX's trailing ``.value`` dropped) and `leaf_name(path)` →
``"w_in"``. The Muon / AdamW / weight-decay groups (`zaya_jax.train.optimizer`) are keyed on `leaf_name`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

_VALUE_ATTRS = ("value", "raw_value")


def path_parts(path: tuple) -> list[str]:
    """Key-path entries as strings, without NNX's trailing `.value` / `.raw_value`."""
    parts = jax.tree_util.keystr(path, simple=True, separator="\x1f").split("\x1f") if path else []
    while parts and parts[-1] in _VALUE_ATTRS:
        parts.pop()
    return [p for p in parts if p]


def path_name(path: tuple) -> str:
    """'layers/moe/w_in' for the key path of a leaf (of params, optimizer state or a checkpoint tree)."""
    return "/".join(path_parts(path))


def leaf_name(path: tuple) -> str:
    """The last name along the path: 'w_in' for 'layers/moe/w_in' ('' for the root)."""
    parts = path_parts(path)
    return parts[-1] if parts else ""


def map_named(fn: Callable[[str, Any], Any], tree: Any) -> Any:
    """`fn(leaf_name, leaf)` over every array leaf of `tree`, same structure out."""
    return jax.tree_util.tree_map_with_path(lambda p, x: fn(leaf_name(p), x), tree)
