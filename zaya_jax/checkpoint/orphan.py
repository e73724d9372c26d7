"""A supervised trainer never outlives its supervisor (no jax import).

`launch.supervise` names itself to its trainer through the environment ($ZAYA_SUPERVISOR_PID, and the
process's start time, $ZAYA_SUPERVISOR_START, so a reused pid is not mistaken for it). Two mechanisms stop a
trainer whose supervisor died (SIGKILL included):

* the parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, set by the supervisor in its child between fork
  and exec): the child gets SIGTERM the moment the supervisor dies;
* `watch_supervisor`, a thread in the trainer (started by every launcher and by the trainer's checkpointer)
  that polls the supervisor's pid — the fallback for trainers under a wrapper (`timeout`, `srun`, a shell),
  which the parent-death signal does not reach, and for other operating systems.

Either way the trainer gets SIGTERM: it finishes the step, saves a checkpoint and exits (the preemption path
of `TrainCheckpointer`). A trainer that has not exited `grace_s` seconds later (stuck in a compile, or before
it could install its handler) is killed (SIGKILL); committed checkpoints are never affected.

Both act from inside the trainer, so neither ends a trainer that is SIGSTOPped or truly hung (a C call holding
the GIL). `watch_supervisor` therefore also starts a sentinel process (`zaya_jax.checkpoint.sentinel`, standard
library only, in its own session): when the supervisor is gone it sends the trainer SIGTERM and SIGCONT (a
stopped trainer resumes, saves and exits) and SIGKILL if it still runs a little after `grace_s`. A separate
process rather than a second thread, because only another process can act on a stopped one; the trainer, not
the supervisor, starts it, because the supervisor's death is the case it covers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

from zaya_jax.checkpoint.events import EVENT_LOG_ENV, EventLog

SUPERVISOR_PID_ENV = "ZAYA_SUPERVISOR_PID"
SUPERVISOR_START_ENV = "ZAYA_SUPERVISOR_START"
ORPHAN_GRACE_ENV = "ZAYA_ORPHAN_GRACE_S"
DEFAULT_GRACE_S = 15.0  # after the supervisor is gone: time to save and exit before SIGKILL
_PR_SET_PDEATHSIG = 1
_watcher: threading.Thread | None = None


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 (state) on; [] where there is no /proc or no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (OSError, ValueError):
        return []
    return stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses


def start_time(pid: int) -> str | None:
    """The kernel's start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22); None where
    there is no /proc or no such process."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, started: str | None = None) -> bool:
    """Is process `pid` running (and, if `started` is given and /proc exists, the same process as then)?"""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (ValueError, OverflowError):
        return False
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):  # exited, not yet reaped
        return False
    return not started or len(fields) <= 19 or fields[19] == started


def die_with_parent() -> None:
    """`Popen(preexec_fn=...)`: the child gets SIGTERM when the process that started it dies (Linux only;
    elsewhere a no-op). Exits at once if that process is already gone (the race between fork and prctl)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent = int(os.environ.get(SUPERVISOR_PID_ENV, "0") or 0)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if parent and os.getppid() != parent:
        os._exit(1)


def supervisor_from_env() -> tuple[int, str | None] | None:
    """(pid, start time) of the supervisor named in the environment, or None when unsupervised."""
    raw = os.environ.get(SUPERVISOR_PID_ENV, "")
    if not raw.strip().isdigit():
        return None
    return int(raw), os.environ.get(SUPERVISOR_START_ENV) or None


def _log_lost(pid: int) -> None:
    if os.environ.get(EVENT_LOG_ENV):
        EventLog(os.environ[EVENT_LOG_ENV], "trainer").write("supervisor_lost", supervisor_pid=pid)


def watch_supervisor(on_lost=None, poll_s: float = 1.0) -> threading.Thread | None:
    """Start (once per process) the thread that stops this process when its supervisor is gone.

    on_lost(pid): called first (default: a "supervisor_lost" row in $ZAYA_EVENT_LOG). Then SIGTERM to this
    process, and SIGKILL after $ZAYA_ORPHAN_GRACE_S (default DEFAULT_GRACE_S) seconds. Returns the thread
    (None: not supervised)."""
    global _watcher
    supervisor = supervisor_from_env()
    if supervisor is None or os.getpid() == supervisor[0]:
        return None
    if _watcher is not None and _watcher.is_alive():
        return _watcher
    try:
        grace = float(os.environ.get(ORPHAN_GRACE_ENV, DEFAULT_GRACE_S))
    except ValueError:
        grace = DEFAULT_GRACE_S

    def watch() -> None:
        pid, started = supervisor
        while process_alive(pid, started):
            time.sleep(poll_s)
        try:
            (on_lost or _log_lost)(pid)
        except Exception:  # noqa: BLE001 - stopping the orphan matters more than the report
            pass
        print(
            f"supervisor (pid {pid}) is gone: saving and stopping (killed in {grace:g} s if still running)",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os.kill(os.getpid(), signal.SIGKILL)

    _watcher = threading.Thread(target=watch, name="zaya-supervisor-watch", daemon=True)
    _watcher.start()
    _start_sentinel(supervisor, grace)
    return _watcher


def _start_sentinel(supervisor: tuple[int, str | None], grace: float) -> None:
    """The out-of-process watchdog (`zaya_jax.checkpoint.sentinel`) for a trainer that cannot stop itself (Linux:
    it reads /proc)."""
    if not os.path.isdir("/proc/self"):
        return
    import subprocess

    pid = os.getpid()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sentinel.py")
    args = [str(pid), start_time(pid) or "", str(supervisor[0]), supervisor[1] or "", f"{grace:g}"]
    try:
        subprocess.Popen(
            [sys.executable, "-S", path, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the trainer's process group (SIGSTOP, SIGINT) does not reach it
        )
    except OSError:  # the in-process watchdog still runs
        pass
