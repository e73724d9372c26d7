"""One train step of a config on one device, built the way training builds it (`zaya_jax.train.setup.prepare`:
the default ZeRO-1 step with Muon + AdamW), compiled ahead of time so its compile time and compiled memory can be
read, then run or timed. Shared by the parity (section 3), throughput (4) and memory (5) sections.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from zaya_jax.bench import common
from zaya_jax.bench.inputs import make_batches
from zaya_jax.config import validate
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.planning.abstract_step import FAST_COMPILE
from zaya_jax.planning.plan import compiled_memory
from zaya_jax.train.loop import to_global
from zaya_jax.train.setup import prepare


def one_device(config: ml_collections.ConfigDict, **overrides: Any) -> ml_collections.ConfigDict:
    """A validated copy of `config` on a one-device mesh with `section.field` overrides
    (`{"model.dtype": "bfloat16", "model.kernels.attention": "xla"}`)."""
    c = ml_collections.ConfigDict(config.to_dict())
    c.mesh.data, c.mesh.expert, c.mesh.context = 1, 1, 1
    c.train.batch_ramp = ()
    for key, value in overrides.items():
        *path, field = key.split(".")
        node = c
        for name in path:
            node = node[name]
        node[field] = value
    return validate(c)


def token_batch(config: ml_collections.ConfigDict, seed: int = 0) -> dict[str, np.ndarray]:
    """One batch of uniform random token ids [B, S] (`bench.inputs.make_batches`), labels = the next tokens,
    every position counted."""
    t = config.train
    ids = make_batches(config.model.vocab_size, t.global_batch_size, t.seq_len + 1, 1, seed)[0].astype(np.int32)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": np.ones(ids[:, 1:].shape, np.float32)}


@dataclasses.dataclass
class StepRun:
    """A built and compiled train step with its state on one device (`build`)."""

    config: ml_collections.ConfigDict
    mesh: Any
    state: Any
    compiled: Any
    batch: dict
    setup_s: float  # state created, step traced and lowered
    compile_s: float

    def memory(self) -> dict[str, float]:
        """Compiled memory (`compiled.memory_analysis()`): argument, output, alias, temp and
        peak = argument + output − alias + temp bytes, as `zaya_jax.planning.plan` reads it."""
        return compiled_memory(self.compiled)  # the planner's own reading, not a second one

    def step(self) -> dict:
        """Run one step on the batch; returns its metrics (on device)."""
        with jax.set_mesh(self.mesh):
            self.state, metrics = self.compiled(self.state, self.batch)
        return metrics

    def losses(self, steps: int) -> list[float]:
        """The loss of each of `steps` steps (the same batch each step)."""
        return [float(self.step()["loss"]) for _ in range(steps)]

    def time(self, warmup: int, trials: int) -> tuple[common.Timing, dict]:
        """Wall time per step (device-synchronised; warm-up steps untimed) and the last step's metrics on host."""
        last: dict = {}

        def one():
            nonlocal last
            last = self.step()
            return last["loss"]

        timing = common.time_fn(one, warmup=warmup, trials=trials)
        return timing, jax.device_get(last)

    def release(self) -> None:
        """Drop the state and executable (device memory) before the next case."""
        self.state = self.compiled = None
        gc.collect()


def build(config: ml_collections.ConfigDict, fast_compile: bool = False, seed: int = 0) -> StepRun:
    """State on the first device, the step lowered and compiled ahead of time (setup / compile seconds kept).
    fast_compile: the planner's options that skip LLVM optimisation (`FAST_COMPILE`; smoke runs, where
    compile time dominates and the step's speed does not matter)."""
    mesh = make_mesh(config, jax.devices()[:1])
    t0 = time.perf_counter()
    training = prepare(config, mesh)
    batch = to_global(token_batch(config, seed), mesh)
    with jax.set_mesh(mesh):
        lowered = training.step.jitted.lower(training.state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options=FAST_COMPILE if fast_compile else None)
    t2 = time.perf_counter()
    return StepRun(config, mesh, training.state, compiled, batch, t1 - t0, t2 - t1)


def release_all(runs: Sequence[StepRun | None] = ()) -> None:
    """Release `runs` and jax's caches of compiled programs."""
    for r in runs:
        if r is not None:
            r.release()
    jax.clear_caches()
    gc.collect()
