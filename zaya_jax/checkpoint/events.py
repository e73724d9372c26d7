"""JSONL event log and heartbeat file shared by the trainer and `launch.supervise` (no jax import).

Event log: one JSON object per line, `{"time", "source", "pid", "event", ...}`, appended with a single
`write` per line (O_APPEND), so the supervisor and the trainer can share one file.

Heartbeat: a small JSON file `{"step", "phase", "time", "pid", "host"}` replaced atomically (write + rename)
after every training step. The supervisor treats a heartbeat that stops changing as a hang.

A supervisor gives every start of its trainer an id ($ZAYA_ATTEMPT_ID); heartbeats and event rows carry it
as "attempt_id", so the supervisor recognises its trainer's heartbeats and events whatever the process tree
between them (`timeout`, `srun`, `conda run`, a shell: the trainer's pid is not the child's).
Phases: "start" (process up, restoring / compiling), "train" (stepping), "final" (last step done,
final evaluation), "done" (finished), "preempted" (stopped on SIGTERM/SIGINT after saving).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

EVENT_LOG_ENV = "ZAYA_EVENT_LOG"
HEARTBEAT_ENV = "ZAYA_HEARTBEAT_FILE"
ATTEMPT_ENV = "ZAYA_ATTEMPT_ID"
PHASES = ("start", "train", "final", "done", "preempted")


def _atomic_write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str, default: Any = None) -> Any:
    """The parsed JSON file, or `default` if it is missing or unreadable (e.g. mid-replace on odd filesystems)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


class EventLog:
    """Append-only JSONL event log; `path=None` keeps events in memory only (`self.events`)."""

    def __init__(self, path: str | None, source: str, *, enabled: bool = True):
        self.path, self.source, self.enabled = path, source, enabled
        self.events: list[dict] = []
        if path and enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(self, event: str, **fields: Any) -> dict:
        """Record `event` with `fields` (JSON-serialisable); returns the row."""
        row = {"time": round(time.time(), 3), "source": self.source, "pid": os.getpid(), "event": event, **fields}
        if os.environ.get(ATTEMPT_ENV):
            row.setdefault("attempt_id", os.environ[ATTEMPT_ENV])
        self.events.append(row)
        if self.path and self.enabled:
            line = (json.dumps(row, default=str) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return row


def read_events(path: str) -> list[dict]:
    """All complete rows of an event log (a torn last line from a killed writer is skipped)."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


class Heartbeat:
    """Training-loop hook `hook(step, state, metrics)` that rewrites the heartbeat file every step.

    `total_steps` lets it mark the last step as phase "final" (the loop may evaluate afterwards).
    """

    def __init__(self, path: str | None, total_steps: int | None = None, *, enabled: bool = True):
        self.path, self.total_steps, self.enabled = path, total_steps, enabled and bool(path)
        if self.enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    @classmethod
    def for_workdir(cls, workdir: str, total_steps: int | None = None, *, enabled: bool = True) -> "Heartbeat":
        """The file named by $ZAYA_HEARTBEAT_FILE, else `<workdir>/heartbeat.json`."""
        return cls(
            os.environ.get(HEARTBEAT_ENV) or os.path.join(workdir, "heartbeat.json"), total_steps, enabled=enabled
        )

    def beat(self, step: int, phase: str = "train", **extra: Any) -> None:
        if self.enabled:
            _atomic_write_json(
                self.path,
                {
                    "step": int(step),
                    "phase": phase,
                    "time": time.time(),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "attempt_id": os.environ.get(ATTEMPT_ENV),
                    **extra,
                },
            )

    def __call__(self, step: int, state: Any = None, metrics: Any = None) -> None:
        final = self.total_steps is not None and step >= self.total_steps
        self.beat(step, "final" if final else "train")

    def read(self) -> dict | None:
        return read_json(self.path) if self.path else None
