"""What changed between a checkpoint's config and the config a run resumes it with (no jax import).

Every checkpoint's metadata holds the config it was saved with. On resume, `config_changes` lists the fields
that differ (a new learning rate, a larger batch, more steps: allowed, reported in one line and a
"config_changed" event), and `check_resumable` refuses — one line — the fields a resume cannot change: the
model's shape (`GEOMETRY_FIELDS`, the convolution widths and the tied head) and its vocabulary (the
tokenizer the data was tokenised with).
"""

from __future__ import annotations

from typing import Any

from zaya_jax.checkpoint.errors import CheckpointConfigError
from zaya_jax.config import GEOMETRY_FIELDS

FIXED_ON_RESUME = (
    *(f"model.{name}" for name in GEOMETRY_FIELDS),
    "model.cca_time0",
    "model.cca_time1",
    "model.tie_word_embeddings",
    "data.tokenizer",
)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (tuples and lists alike)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def config_changes(saved: dict | None, current: dict) -> dict[str, tuple[Any, Any]]:
    """{dotted field: (saved value, current value)} of every field that differs (fields only one side has
    included: a field added to the config since the save shows as (None, value)). Empty if `saved` is None
    (a checkpoint without a recorded config)."""
    if not isinstance(saved, dict):
        return {}
    old, new = _flat(saved), _flat(current)
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if not _same(old.get(k), new.get(k))}


def check_resumable(changes: dict[str, tuple[Any, Any]], where: str) -> None:
    """Raise CheckpointConfigError (one line) if `changes` touches a field that cannot change on resume."""
    fixed = [k for k in FIXED_ON_RESUME if k in changes]
    if fixed:
        listed = ", ".join(f"{k} {changes[k][0]!r} -> {changes[k][1]!r}" for k in fixed)
        raise CheckpointConfigError(
            f"{where} cannot resume with {listed}: the model's shape and vocabulary are fixed once trained; "
            "pass the saved values or use a new workdir"
        )


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """One line: `train.global_batch_size 8 -> 16, optimizer.learning_rate 0.003 -> 0.001`."""
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
