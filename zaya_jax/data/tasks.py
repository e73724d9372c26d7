"""Splitting a preparation into tasks: a deterministic function of the input files, their sizes and `task_bytes`.

Files are taken in their sorted order (`zaya_jax.data.inputs.expand_inputs`) and cut into consecutive tasks of
about `task_bytes` input bytes each: small files are grouped, JSONL files larger than what is left of a task are
cut into byte ranges (a line belongs to the range holding its first byte), other files (one document each,
Parquet) are never cut. The prepared rows are the tasks' rows in task order, so the output is the same however
many workers or machines run the tasks.
"""

from __future__ import annotations

from typing import Sequence

from zaya_jax.data.inputs import splittable

Chunk = tuple[str, int, "int | None"]  # (path, start byte, stop byte or None = end of file)

MIN_TASK_BYTES, MAX_TASK_BYTES = 1 << 20, 256 << 20
TASKS_TARGET = 64  # the automatic task size aims at this many tasks for small inputs


def default_task_bytes(total_bytes: int) -> int:
    """Automatic task size: about TASKS_TARGET tasks, within [1 MiB, 256 MiB] (10 TB: ~40,000 tasks)."""
    return int(min(max(total_bytes // TASKS_TARGET, MIN_TASK_BYTES), MAX_TASK_BYTES))


def plan_tasks(files: Sequence[str], sizes: Sequence[int], task_bytes: int) -> list[list[Chunk]]:
    """The chunks of each task, in order; every input byte belongs to exactly one task."""
    tasks: list[list[Chunk]] = []
    current: list[Chunk] = []
    filled = 0
    for path, size in zip(files, sizes):
        start = 0
        while True:
            room = task_bytes - filled
            take = size - start
            if splittable(path) and take > room:
                take = room
            stop = start + take
            current.append((path, start, None if stop >= size else stop))
            filled += take
            if filled >= task_bytes:
                tasks.append(current)
                current, filled = [], 0
            start = stop
            if start >= size:
                break
    if current:
        tasks.append(current)
    return tasks
