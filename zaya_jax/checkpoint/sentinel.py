"""The trainer's out-of-process watchdog: ends a trainer that cannot end itself once its supervisor is gone.

Run by `orphan.watch_supervisor` as its own small process (by file path, standard library only, in a session
of its own so a signal to the trainer's process group does not reach it):

    python sentinel.py TRAINER_PID TRAINER_START SUPERVISOR_PID SUPERVISOR_START GRACE_S

The trainer's own watchdog thread and the parent-death signal stop a trainer that can still run Python. They
cannot stop one that is SIGSTOPped (no thread of it runs, a SIGTERM stays pending) or truly hung (a C call that
holds the GIL): such a trainer would outlive a SIGKILLed supervisor until a new supervisor took its workdir over.
This process polls both pids (`POLL_S`); when the supervisor is gone and the trainer is not, it first gives the
trainer's own watchdog `HEAD_START_S` to notice (it logs the "supervisor_lost" event, then stops its process;
a SIGTERM from here first could end the trainer before that row is written), then sends the trainer SIGTERM and
SIGCONT — a stopped trainer resumes and takes the preemption path (save, exit) — and SIGKILL
if it still runs GRACE_S + `MARGIN_S` seconds later (the margin leaves the trainer's own SIGKILL after GRACE_S to
come first). It exits as soon as the trainer does. Committed checkpoints are never affected by a kill.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5
HEAD_START_S = 2.0  # > the trainer's own watchdog poll (1 s by default)
MARGIN_S = 2.0


def _alive(pid: int, started: str) -> bool:
    """Is `pid` the process that started at `started` (/proc/PID/stat field 22), and not a zombie?"""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and (not started or fields[19] == started)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone_within(pid: int, started: str, seconds: float) -> bool:
    """Whether the process ends within `seconds` (polled every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid, started):
            return True
        time.sleep(0.1)
    return False


def main(argv: list[str]) -> int:
    trainer, trainer_start, supervisor, supervisor_start, grace = argv
    trainer, supervisor, grace_s = int(trainer), int(supervisor), float(grace)
    while _alive(trainer, trainer_start):
        if not _alive(supervisor, supervisor_start):
            break
        time.sleep(POLL_S)
    else:
        return 0  # the trainer ended first: nothing to do
    if _gone_within(trainer, trainer_start, HEAD_START_S):
        return 0  # its own watchdog stopped it
    _signal(trainer, signal.SIGTERM)
    _signal(trainer, signal.SIGCONT)
    if _gone_within(trainer, trainer_start, grace_s + MARGIN_S):
        return 0
    print(
        f"supervisor (pid {supervisor}) is gone and its trainer (pid {trainer}) did not stop within "
        f"{grace_s + MARGIN_S:g} s (stopped or hung): killed",
        file=sys.stderr,
        flush=True,
    )
    _signal(trainer, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
