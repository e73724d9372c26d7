"""A training-loop hook that writes a `jax.profiler` trace (TensorBoard / XProf / Perfetto) for a step range.

    hook = ProfileHook("runs/x/profile", start=10, stop=12)   # traces optimizer steps 10 and 11
    train(config, workdir, hooks=[hook]); hook.close()

`zaya_jax.train.loop.train` calls every hook as `hook(step, state, metrics)` after dispatching the step
that brings the state to `step` completed steps. The trace starts when `step == start` (so the next
dispatched step, number `start` counting from 0, is the first one traced) and stops when `step == stop`,
after waiting for the device to finish, so the traced window holds steps [start, stop). Steps run
asynchronously, so the state is synchronised once before starting to keep earlier steps out of the trace.
No flag parsing here: `launch.train` builds the hook from `--profile_steps` / `--profile_dir`.
"""

from __future__ import annotations

import os
from typing import Any

import jax


class ProfileHook:
    """Trace optimizer steps [start, stop) into `log_dir` (one trace; process 0 only unless `all_processes`)."""

    def __init__(self, log_dir: str, start: int, stop: int, *, all_processes: bool = False):
        if not 1 <= start < stop:
            raise ValueError(
                f"profile steps must satisfy 1 <= start < stop (step 0 compiles), got start={start}, stop={stop}"
            )
        self.log_dir, self.start, self.stop = os.path.abspath(log_dir), int(start), int(stop)
        self.enabled = all_processes or jax.process_index() == 0
        self.active = False
        self.done = False

    def _begin(self, state: Any) -> None:
        jax.block_until_ready(state)
        os.makedirs(self.log_dir, exist_ok=True)
        jax.profiler.start_trace(self.log_dir)
        self.active = True

    def _end(self, state: Any) -> None:
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        self.active, self.done = False, True

    def __call__(self, step: int, state: Any, metrics: Any) -> None:
        del metrics
        if not self.enabled or self.done:
            return
        if not self.active and step == self.start:
            self._begin(state)
        elif self.active and step >= self.stop:
            self._end(state)

    def close(self) -> None:
        """Stop a trace still running (training ended inside the window)."""
        if self.active:
            jax.profiler.stop_trace()
            self.active, self.done = False, True
