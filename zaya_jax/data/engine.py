"""datatrove's local executor as the preparation uses it (imported only when tasks run on worker processes).

`LocalPipelineExecutor` runs `workers` tasks at a time in separate processes, skips tasks it has marked
complete and, with `local_tasks` / `local_rank_offset`, runs only this machine's share of the tasks.
"""

from __future__ import annotations

from datatrove.executor import LocalPipelineExecutor


class QuietLocalExecutor(LocalPipelineExecutor):
    """datatrove prints a task's INFO lines on the console for local rank 0 only; every rank is shifted by one, so
    the console shows only errors and the task logs (under the logging dir) keep everything."""

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        return super()._run_for_rank(rank, local_rank + 1, node_rank)


def executor(pipeline: list, *, tasks: int, workers: int, logging_dir: str, ranks: range) -> QuietLocalExecutor:
    """An executor of `tasks` tasks that runs `ranks` (this machine's share) with `workers` processes."""
    return QuietLocalExecutor(
        pipeline,
        tasks=tasks,
        workers=workers,
        logging_dir=logging_dir,
        local_tasks=len(ranks),
        local_rank_offset=ranks.start,
    )
