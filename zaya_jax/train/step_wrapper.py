"""The jitted train step as the loop calls it: under its mesh, with only the arrays the step takes.

Both steps (`zaya_jax.train.step`, GSPMD; `zaya_jax.train.zero1.step`, ZeRO-1) return their jitted function
wrapped by `step_on_mesh`, so `zaya_jax.train.setup.Training.step` has one calling convention.
"""

from __future__ import annotations

from typing import Callable

import jax

from zaya_jax.train.microbatch import BATCH_KEYS


def step_on_mesh(jitted: Callable, mesh) -> Callable:
    """`step(state, batch)`: `jitted(state, batch)` called under `mesh` with only the batch's BATCH_KEYS arrays
    (a loader's batch may carry more); `step.jitted` is the jitted function itself (for `.lower()`)."""

    def step(state, batch):
        with jax.set_mesh(mesh):
            return jitted(state, {k: batch[k] for k in BATCH_KEYS})

    step.jitted = jitted
    return step
