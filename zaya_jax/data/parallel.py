"""Running the tasks of a preparation: in this process, or on `datatrove`'s executor with N worker processes.

`datatrove` (Hugging Face's pipeline library for web-scale corpora) schedules the tasks: its
`LocalPipelineExecutor` runs `workers` of them at a time in separate processes, skips tasks it has marked
complete (`<output>/.datatrove/completions/`) and, with `local_tasks` / `local_rank_offset`, runs only one
machine's share of them — the way a SLURM array (`launch/slurm/prepare_data.sbatch`) or any set of machines
splits the job. Our code does only the work of one task (`zaya_jax.data.packing.run_task`). A task's own
`done.json` is the record that counts; a completion mark without it (a task directory deleted by hand) is
dropped before the run.

One progress bar covers this machine's share of the job: tasks done, tokens/s, ETA.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

from zaya_jax.data import packing
from zaya_jax.data.tasks import Chunk
from zaya_jax.data.tokenizer import Tokenizer, load_tokenizer

ENGINE_DIR = ".datatrove"  # datatrove's logging dir (completion marks, logs, stats) inside the output dir
POLL_SECONDS = 0.5


class TaskStep:
    """A datatrove pipeline step: `step(data, rank, world_size)` prepares task `rank` (picklable)."""

    def __init__(self, out: str, tasks: Sequence[Sequence[Chunk]], tokenizer, vocab_size, *, tok=None, **task_kw):
        """`tokenizer` / `vocab_size`: as `load_tokenizer` takes them (loaded once per process, or `tok` if given);
        `task_kw`: the keyword arguments of `packing.run_task`."""
        self.out, self.tasks, self.tokenizer, self.vocab_size, self.task_kw = out, tasks, tokenizer, vocab_size, task_kw
        self._tok: Tokenizer | None = tok

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _tok=None)

    def run(self, rank: int) -> dict:
        if self._tok is None:
            self._tok = _loaded(self.tokenizer, self.vocab_size)
        return packing.run_task(self.out, rank, self.tasks[rank], self._tok, **self.task_kw)

    def __call__(self, data, rank: int, world_size: int):
        del data, world_size
        os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core per worker process (set before tokenizers starts)
        _quiet_engine()
        self.run(rank)
        return None

    def __repr__(self) -> str:
        return f"zaya_jax.data TaskStep({len(self.tasks)} tasks -> {self.out})"


_TOKENIZERS: dict = {}  # per worker process: the engine unpickles the step for every task


def _loaded(tokenizer, vocab_size) -> Tokenizer:
    """The tokenizer `tokenizer` names, loaded once per process (a spec string) or as given (an object)."""
    if not isinstance(tokenizer, str):
        return tokenizer
    key = (tokenizer, vocab_size)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = load_tokenizer(tokenizer, vocab_size=vocab_size)
    return _TOKENIZERS[key]


def _quiet_engine() -> None:
    """datatrove logs through loguru (task logs under .datatrove/logs); keep its lines off the console so bad
    input ends in one line from the launcher."""
    from loguru import logger

    logger.disable("datatrove")


def _drop_stale_marks(out: str, ranks: range) -> None:
    marks = os.path.join(out, ENGINE_DIR, "completions")
    for rank in ranks:
        mark = os.path.join(marks, f"{rank:05d}")
        if os.path.exists(mark) and not os.path.exists(os.path.join(out, packing.task_name(rank), packing.DONE)):
            os.remove(mark)


class _Progress:
    """One tqdm bar over a set of tasks: tasks done, tokens/s of this run, ETA; fed from the tasks' done.json."""

    def __init__(self, out: str, ranks: range, enabled: bool):
        from tqdm import tqdm

        self.out, self.pending, self.tokens, self.t0 = out, set(ranks), 0, time.perf_counter()
        self.bar = tqdm(total=len(ranks), unit="task", desc=f"prepare {os.path.basename(out)}", disable=not enabled)

    def add(self, summary: dict) -> None:
        self.tokens += summary["tokens"]
        rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"{rate / 1e6:.2f}M tok/s", refresh=False)
        self.bar.update(1)

    def poll(self) -> None:
        for rank in sorted(self.pending):
            marker = os.path.join(self.out, packing.task_name(rank), packing.DONE)
            if os.path.exists(marker):
                self.pending.discard(rank)
                self.add(packing.read_json(marker))

    def close(self) -> None:
        self.bar.close()


def run_tasks(step: TaskStep, ranks: range, *, workers: int = 1, progress: bool = True) -> None:
    """Prepare tasks `ranks` of `step`: in this process when workers == 1, else on datatrove with `workers`
    processes. Raises the first task's error (e.g. `DataError` for bad input)."""
    bar = _Progress(step.out, ranks, progress)
    workers = min(workers, len(ranks))
    try:
        if workers <= 1:
            for rank in ranks:
                bar.pending.discard(rank)
                bar.add(step.run(rank))
            return
        _drop_stale_marks(step.out, ranks)
        _quiet_engine()
        from zaya_jax.data import engine

        run = engine.executor(
            [step], tasks=len(step.tasks), workers=workers, logging_dir=os.path.join(step.out, ENGINE_DIR), ranks=ranks
        )
        _poll_while(run.run, bar)
    finally:
        bar.close()


def _poll_while(fn: Callable[[], object], bar: _Progress) -> None:
    """Run `fn` in a thread while the bar follows the tasks' done.json files; re-raise its error."""
    error: list[BaseException] = []

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            error.append(e)

    thread = threading.Thread(target=target, name="zaya-prepare", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(POLL_SECONDS)
        bar.poll()
    if error:
        raise error[0]
