"""datatrove's local executor as the preparation uses it (imported only when tasks run on worker processes).

`LocalPipelineExecutor` runs `workers` tasks at a time in separate processes, skips tasks it has marked
complete and, with `local_tasks` / `local_rank_offset`, runs only this machine's share of the tasks.

Its `multiprocess.Manager()` (the shared queue and counter of the run) is a server process forked from the
preparing process that does not watch it: killed alone (`kill -9` of the launcher, not of its process group), the
launcher would leave that server running forever. Every process `multiprocess` forks from here is therefore
asked to die with this one (Linux `prctl(PR_SET_PDEATHSIG, SIGKILL)`, `multiprocess.util.register_after_fork`);
the worker pool (started from a fork server that exits when its parent does) holds no data beyond files written
atomically (`zaya_jax.data.packing.write_atomic`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

from datatrove.executor import LocalPipelineExecutor
from multiprocess import util as mp_util

_PR_SET_PDEATHSIG = 1


class _Parent:
    """The preparing process (its pid), held for `register_after_fork` (which keeps only a weak reference)."""

    pid = 0


_PARENT = _Parent()


def _die_with_parent(parent: _Parent) -> None:
    """In a child `multiprocess` forked from the preparing process: SIGKILL when that process dies."""
    if not sys.platform.startswith("linux") or not parent.pid:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent.pid:  # it died between the fork and the prctl
        os._exit(0)


class QuietLocalExecutor(LocalPipelineExecutor):
    """datatrove prints a task's INFO lines on the console for local rank 0 only; every rank is shifted by one, so
    the console shows only errors and the task logs (under the logging dir) keep everything."""

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        return super()._run_for_rank(rank, local_rank + 1, node_rank)


def executor(pipeline: list, *, tasks: int, workers: int, logging_dir: str, ranks: range) -> QuietLocalExecutor:
    """An executor of `tasks` tasks that runs `ranks` (this machine's share) with `workers` processes; the processes
    it forks die with this one (module docstring)."""
    if not _PARENT.pid:
        _PARENT.pid = os.getpid()
        mp_util.register_after_fork(_PARENT, _die_with_parent)
    return QuietLocalExecutor(
        pipeline,
        tasks=tasks,
        workers=workers,
        logging_dir=logging_dir,
        local_tasks=len(ranks),
        local_rank_offset=ranks.start,
    )
