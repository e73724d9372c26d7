"""Default `config.checkpoint` section (checkpointing, loss guard, fault injection) and its validation.

`zaya_jax.config.default_config` calls `add_to(config)`; `validate(config)` raises `CheckpointConfigError`
naming the field and the fix (`make_checkpointer` calls it).
"""

from __future__ import annotations

import ml_collections

from zaya_jax.checkpoint.errors import CheckpointConfigError


def add_to(config: ml_collections.ConfigDict) -> None:
    """Add `config.checkpoint`."""
    config.checkpoint = ml_collections.ConfigDict(
        dict(
            dir="",  # "" = <workdir>/checkpoints
            every=100,  # save every N optimizer steps (0 = only at the end, on preemption and on demand)
            keep=3,  # keep the newest K committed checkpoints ...
            keep_every=0,  # ... plus every step that is a multiple of M (0 = none)
            async_save=True,  # write in a background thread (device→host copy is still synchronous)
            save_initial=False,  # also save the freshly initialised state (step 0) of a run that starts fresh
            restore=True,  # resume from the newest committed checkpoint in `dir`
            nan_guard=True,  # non-finite loss / grad norm → roll back to the last good checkpoint
            spike_zscore=0.0,  # loss z-score over `spike_window` steps that counts as a spike (0 = off)
            spike_window=32,
            max_rollbacks=3,  # rollbacks onto one checkpoint before the run gives up
            faults="",  # fault injection, e.g. "crash@5,nan@12" (also env ZAYA_FAULTS; see faults.py)
        )
    )


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise `CheckpointConfigError` for invalid `config.checkpoint` values."""
    c = config.checkpoint
    for name in ("every", "keep", "keep_every", "spike_window", "max_rollbacks"):
        if int(c[name]) < 0:
            raise CheckpointConfigError(f"checkpoint.{name}={c[name]} must be >= 0")
    if int(c.keep) < 1:
        raise CheckpointConfigError(f"checkpoint.keep={c.keep} must be >= 1 (the newest checkpoint is always kept)")
    if float(c.spike_zscore) < 0:
        raise CheckpointConfigError(f"checkpoint.spike_zscore={c.spike_zscore} must be >= 0 (0 = off)")
    if float(c.spike_zscore) > 0 and int(c.spike_window) < 4:
        raise CheckpointConfigError(f"checkpoint.spike_window={c.spike_window} must be >= 4 when spike_zscore > 0")
