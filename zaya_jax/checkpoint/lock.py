"""Exclusive lock on a run's directories, so two trainers (or a trainer and a reshard) never write into one
(no jax import).

The lock of a directory is the file `<dir>/.zaya.lock`, held with `flock` for as long as the holder runs and
holding a JSON record of the holder: {"host", "pid", "owner", "since", "command", "supervisor"} (the
supervisor's [pid, start time] when `launch.supervise` started the holder, else null; `holder` reads it so
a new supervisor can take over the trainer of a dead one). The kernel drops a flock
when its holder dies (SIGKILL included), so the lock of a dead process is taken over; its record is returned
so the caller can log the takeover. A lock held from another host (a shared filesystem) is waited for up to
`wait_s` seconds first, since a filesystem may take a while to notice a dead client. Where the filesystem
has no flock (some Lustre mounts), the record decides instead: a holder on this host is alive iff its pid
is; one on another host is alive while it keeps refreshing the file (every REFRESH_S seconds).

    lock = DirLock({"workdir": workdir, "checkpoint directory": ckpt_dir}, owner="train")
    stale = lock.acquire()      # WorkdirLockedError (one line: who holds it, what to do) if held
    ...
    lock.release()
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time

from zaya_jax.checkpoint.errors import CheckpointConfigError, WorkdirLockedError
from zaya_jax.checkpoint.orphan import supervisor_from_env

LOCK_NAME = ".zaya.lock"
REFRESH_S, STALE_S = 60.0, 300.0  # no-flock filesystems: holder refresh period / age of a dead holder's file
OTHER_HOST_WAIT_S = 180.0  # how long a lock held from another host is waited for before giving up
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_held: dict[str, list] = {}  # lock file -> [fd, count]: re-entrant within one process (e.g. a notebook)


def _record(owner: str) -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "owner": owner,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:300],
        "supervisor": supervisor_from_env(),
    }


def _read(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        rec = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _write(fd: int, rec: dict | None) -> None:
    os.ftruncate(fd, 0)
    if rec is not None:
        os.pwrite(fd, json.dumps(rec).encode(), 0)
    os.fsync(fd)


def _alive(rec: dict, path: str) -> bool:
    """No-flock filesystems: is the recorded holder still running?"""
    if rec.get("host") != socket.gethostname():
        return time.time() - os.path.getmtime(path) < STALE_S
    try:
        os.kill(int(rec.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return int(rec.get("pid", 0)) > 0


def _holder(rec: dict | None) -> str:
    if not rec:
        return "another process"
    return f"{rec.get('owner', 'a process')} (pid {rec.get('pid')} on {rec.get('host')}, since {rec.get('since')})"


def holder(directory: str) -> dict | None:
    """The record of the live process holding `directory`'s lock (flock held), or None if nobody holds it
    (or the filesystem has no flock: then the holder's own acquire decides)."""
    path = os.path.join(os.path.abspath(os.path.expanduser(directory)), LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return _read(fd) or {}
    except OSError:
        return None
    finally:
        os.close(fd)


class DirLock:
    """Lock on every directory of `dirs` ({label: path}); see the module docstring."""

    def __init__(self, dirs: dict[str, str], owner: str):
        self.dirs = {label: os.path.abspath(os.path.expanduser(p)) for label, p in dirs.items()}
        self.owner = owner
        self._files: list[str] = []
        self._stop = threading.Event()

    def acquire(self, wait_s: float = OTHER_HOST_WAIT_S) -> list[dict]:
        """Take every lock (in path order) or none; returns the records of dead holders taken over."""
        stale = []
        try:
            for label, path in sorted(self.dirs.items(), key=lambda kv: kv[1]):
                rec = self._acquire_one(label, path, wait_s)
                if rec is not None:
                    stale.append(dict(rec, path=path))
        except BaseException:
            self.release()
            raise
        return stale

    def _acquire_one(self, label: str, directory: str, wait_s: float) -> dict | None:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise CheckpointConfigError(f"{label} {directory} exists and is not a directory; pass a directory path")
        try:
            os.makedirs(directory, exist_ok=True)
            path = os.path.realpath(os.path.join(directory, LOCK_NAME))
            if path in _held:
                _held[path][1] += 1
                self._files.append(path)
                return None
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise CheckpointConfigError(
                f"{label} {directory}: cannot create its lock file ({err.strerror}); pass a writable directory"
            ) from err
        try:
            previous = self._lock_fd(fd, path, label, directory, wait_s)
            _write(fd, _record(self.owner))
        except BaseException:
            os.close(fd)
            raise
        _held[path] = [fd, 1]
        self._files.append(path)
        return previous if previous and previous.get("pid") != os.getpid() else None

    def _lock_fd(self, fd: int, path: str, label: str, directory: str, wait_s: float) -> dict | None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return _read(fd)
            except BlockingIOError:
                rec = _read(fd)
            except OSError as err:
                if err.errno not in _NO_FLOCK:
                    raise
                rec = _read(fd)
                if rec is None or not _alive(rec, path):
                    self._start_refresh(path)
                    return rec
            other_host = bool(rec) and rec.get("host") != socket.gethostname()
            if not other_host or time.monotonic() >= deadline:
                raise WorkdirLockedError(
                    f"{label} {directory} is in use by {_holder(rec)}; wait for it to finish or "
                    f"stop it, or use another {label}"
                )
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))

    def _start_refresh(self, path: str) -> None:
        def refresh():
            while not self._stop.wait(REFRESH_S):
                try:
                    os.utime(path)
                except OSError:
                    return

        threading.Thread(target=refresh, name="zaya-lock-refresh", daemon=True).start()

    def release(self) -> None:
        """Drop this object's locks (idempotent); the lock files stay, emptied."""
        self._stop.set()
        for path in reversed(self._files):
            entry = _held.get(path)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del _held[path]
                try:
                    _write(entry[0], None)
                    fcntl.flock(entry[0], fcntl.LOCK_UN)
                except OSError:
                    pass
                os.close(entry[0])
        self._files = []

    def __enter__(self) -> "DirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
