"""Checkpointing and fault tolerance: Orbax checkpoints restorable onto any mesh, loss guard with
rollback, preemption handling, fault injection, heartbeat/event files for `launch.supervise`.

    from zaya_jax import checkpoint
    ckpt = checkpoint.make_checkpointer(config, workdir)        # the training loop's checkpointer
    config, model = checkpoint.load_model("runs/x/checkpoints")  # inference / eval

Attributes are imported lazily so the jax-free parts (`errors`, `events`, `elastic`, `lock`, `faults` parsing
used by `launch.supervise` and before jax starts in `launch.train`) do not pull in jax/orbax.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CheckpointError": "errors",
    "CheckpointConfigError": "errors",
    "CorruptCheckpointError": "errors",
    "WorkdirLockedError": "errors",
    "DirLock": "lock",
    "EventLog": "events",
    "Heartbeat": "events",
    "read_events": "events",
    "Checkpointer": "manager",
    "TrainCheckpointer": "trainer",
    "make_checkpointer": "trainer",
    "checkpoint_dir": "trainer",
    "LossGuard": "guard",
    "FaultInjector": "faults",
    "InjectedFault": "faults",
    "parse_faults": "faults",
    "load_model": "model_io",
    "load_train_state": "model_io",
    "resolve_checkpoint": "model_io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
