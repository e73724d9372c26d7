"""Supervise a training process: restart it on crashes, hangs, preemption and device loss.

    python -m launch.supervise --max_restarts=10 --heartbeat_timeout=600 -- \\
        python -m launch.train --config=experiments/zaya1_tiny.py --workdir=runs/tiny

The trainer writes a heartbeat file every step (`$ZAYA_HEARTBEAT_FILE`, set by the supervisor to
`<workdir>/heartbeat.json`). Every start gets an id (`$ZAYA_ATTEMPT_ID`) that the trainer's heartbeats and
event rows carry, so the trainer is followed whatever runs in between (`timeout`, `srun`, `conda run`, a
shell): its heartbeats, not the child's pid, decide. The supervisor
* kills (SIGKILL, whole process group) a trainer whose heartbeat stops changing for
  `--heartbeat_timeout` s while training, or that shows no step within `--startup_timeout` s of
  starting (import, restore, compilation) or of its last step (final evaluation);
* restarts a crashed or killed trainer after an exponential backoff (`--backoff` · 2^k, at most
  `--max_backoff`; k counts consecutive attempts that made no progress), up to `--max_restarts`;
* restarts a trainer that exited 0 after a preemption (heartbeat phase "preempted"), or that was interrupted
  (exit 130 or SIGINT: a second Ctrl-C sent to the trainer itself), at once, and stops when one exits 0 having
  finished;
* does not restart a trainer that exited 78 (`launch.cli.EXIT_BAD_INPUT`: a config / usage / data error,
  or a workdir in use by another run): the same command would fail the same way; it exits 78 too;
* reads the available device count (`--available_devices_file`, default `<workdir>/available_devices`,
  or `--devices`) before every start and exports `ZAYA_AVAILABLE_DEVICES`, so the trainer rebuilds a
  smaller mesh (`mesh.data=-1`) and restores onto it;
* forwards SIGTERM/SIGINT to the trainer (which saves and exits) and then stops; kills (SIGKILL) reach the
  child's process group and the trainer itself if a wrapper moved it out of that group (same host only);
* is never outlived by its trainer: the child gets SIGTERM when the supervisor dies (Linux parent-death
  signal), and the trainer watches the supervisor's pid ($ZAYA_SUPERVISOR_PID) itself, saves and exits,
  and is killed `--orphan_grace` s later if still running (`zaya_jax.checkpoint.orphan`);
* takes over a workdir whose trainer outlived a dead supervisor (on this host): it stops that trainer
  (SIGTERM, SIGKILL after `--grace` s) and starts its own, which resumes from the last checkpoint. A trainer
  still watched by a live supervisor, or started without one, is left alone (the new trainer then stops
  with "in use", exit 78).
A trainer command that cannot be started (a missing program) is a usage error: one line, exit 78.
Every event goes to the JSONL event log shared with the trainer (`--event_log`, default
`<workdir>/events.jsonl`); the last row is a summary (restarts by reason, steps lost, downtime).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types

from absl import flags

from launch import cli
from launch.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from zaya_jax.checkpoint.elastic import AVAILABLE_DEVICES_ENV
from zaya_jax.checkpoint.events import ATTEMPT_ENV, EVENT_LOG_ENV, HEARTBEAT_ENV, EventLog, read_events, read_json
from zaya_jax.checkpoint.faults import available_devices_file, read_available_devices
from zaya_jax.checkpoint.lock import holder
from zaya_jax.checkpoint.orphan import (
    ORPHAN_GRACE_ENV,
    SUPERVISOR_PID_ENV,
    SUPERVISOR_START_ENV,
    die_with_parent,
    process_alive,
    start_time,
)

_STEP_EVENTS = ("save", "fault", "preempted", "finish")
FLAGS = flags.FLAGS
flags.DEFINE_integer("max_restarts", 10, "restarts before giving up", lower_bound=0)
flags.DEFINE_float("heartbeat_timeout", 600.0, "s without a new step while training (> 0)")
flags.DEFINE_float("startup_timeout", 1800.0, "s until the first step / after the last (> 0)")
flags.DEFINE_float("backoff", 5.0, "first restart delay (s), doubled per failure", lower_bound=0)
flags.DEFINE_float("max_backoff", 300.0, "longest restart delay (s)", lower_bound=0)
flags.DEFINE_float("orphan_grace", 15.0, "s a trainer whose supervisor died gets to save before SIGKILL (> 0)")
flags.DEFINE_string("workdir", None, "default: the trainer's --workdir")
flags.DEFINE_string("checkpoint_dir", None, "default: --config.checkpoint.dir or <workdir>/checkpoints")
flags.DEFINE_string("event_log", None, "default: <workdir>/events.jsonl")
flags.DEFINE_string("available_devices_file", None, "default: <workdir>/available_devices")
flags.DEFINE_integer("devices", None, "initial available device count", lower_bound=1)
flags.DEFINE_float("grace", 120.0, "s a signalled trainer gets to save and exit", lower_bound=0)
flags.DEFINE_float("poll", 0.5, "s between checks of the trainer", lower_bound=0.01)
_POSITIVE = ("heartbeat_timeout", "startup_timeout", "orphan_grace")
_FINITE = ("heartbeat_timeout", "startup_timeout", "backoff", "max_backoff", "orphan_grace", "grace", "poll")


def settings(command: list[str]) -> types.SimpleNamespace:
    """The supervisor's settings from the parsed flags and the trainer `command` (what followed `--`)."""
    if not command:
        cli.fail(
            "supervise",
            "put the trainer command after `--`, e.g. python -m launch.supervise -- "
            "python -m launch.train --config=... --workdir=...",
        )
    args = types.SimpleNamespace(
        **{
            name: FLAGS[name].value
            for name in (
                "max_restarts",
                "heartbeat_timeout",
                "startup_timeout",
                "backoff",
                "max_backoff",
                "workdir",
                "checkpoint_dir",
                "event_log",
                "available_devices_file",
                "devices",
                "grace",
                "poll",
                "orphan_grace",
            )
        },
        command=list(command),
    )
    _check_numbers(args)
    if shutil.which(args.command[0]) is None:
        cli.fail("supervise", f"trainer command {args.command[0]!r} not found or not executable; check the command")
    args.workdir = args.workdir or _flag_value(args.command, "--workdir")
    if not args.workdir:
        cli.fail("supervise", "pass --workdir (or --workdir=... in the trainer command)")
    args.workdir = os.path.abspath(args.workdir)
    args.checkpoint_dir = os.path.abspath(
        args.checkpoint_dir
        or _flag_value(args.command, "--config.checkpoint.dir")
        or os.path.join(args.workdir, "checkpoints")
    )
    args.event_log = args.event_log or os.path.join(args.workdir, "events.jsonl")
    args.available_devices_file = args.available_devices_file or available_devices_file(args.workdir)
    return args


def _check_numbers(args: types.SimpleNamespace) -> None:
    """Finite seconds everywhere; timeouts and the orphan grace > 0 (a 0 would kill every trainer at once)."""
    for name in _FINITE:
        if not math.isfinite(getattr(args, name)):
            cli.fail("supervise", f"--{name}={getattr(args, name)} must be a finite number of seconds")
    for name in _POSITIVE:
        if getattr(args, name) <= 0:
            cli.fail("supervise", f"--{name}={getattr(args, name)} must be > 0 seconds")


def _flag_value(command: list[str], flag: str) -> str | None:
    for i, arg in enumerate(command):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
    return None


def committed_steps(directory: str) -> list[int]:
    """Committed steps: step directories that are not Orbax tmp dirs (local-filesystem rename commit)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


class Supervisor:
    def __init__(self, args: types.SimpleNamespace):
        self.args = args
        os.makedirs(args.workdir, exist_ok=True)
        self.events = EventLog(args.event_log, "supervisor")
        self.heartbeat_file = os.path.join(args.workdir, "heartbeat.json")
        self.stop_signal: str | None = None
        self.stop_time = 0.0
        self.proc: subprocess.Popen | None = None
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
        self.attempt_id: str | None = None
        self.trainer_pid: int | None = None  # from this attempt's heartbeats, when on this host
        self.stats = {"restarts": 0, "by_reason": {}, "steps_lost": 0, "downtime_s": 0.0, "attempts": []}

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal, self.stop_time = signal.Signals(signum).name, time.time()
        if self.proc is not None and self.proc.poll() is None:
            self._signal_trainer(signal.SIGTERM)  # the trainer saves and exits 0

    def _devices(self) -> int | None:
        return read_available_devices(self.args.available_devices_file) or self.args.devices

    def _ours(self, row: dict) -> bool:
        """Is this heartbeat / event row from the current attempt's trainer (through any wrapper)?"""
        if row.get("attempt_id") is not None:
            return row["attempt_id"] == self.attempt_id
        return self.proc is not None and row.get("pid") == self.proc.pid  # a trainer that does not stamp ids

    def _signal_trainer(self, sig: int) -> None:
        """`sig` to the child's process group and to the trainer, should a wrapper have moved it elsewhere."""
        for send, target in ((os.killpg, self.proc.pid), (os.kill, self.trainer_pid)):
            if target:
                try:
                    send(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _kill(self) -> int:
        self._signal_trainer(signal.SIGKILL)
        rc = self.proc.wait()
        deadline = time.time() + 30  # a trainer outside the child's group dies on its own schedule
        while self.trainer_pid and time.time() < deadline:
            try:
                os.kill(self.trainer_pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.1)
        return rc

    def take_over_orphan(self) -> None:
        """Stop a trainer on this workdir (this host) whose supervisor is dead, so this one can restart it."""
        rec = holder(self.args.workdir)
        sup = rec.get("supervisor") if rec else None
        if not sup or rec.get("host") != socket.gethostname() or process_alive(*sup):
            return  # nobody, another host, a live supervisor's or an unsupervised run: the trainer decides
        pid = int(rec["pid"])
        self.events.write("takeover", trainer_pid=pid, dead_supervisor_pid=sup[0], since=rec.get("since"))
        print(
            f"supervise: taking over {self.args.workdir}: its trainer (pid {pid}) outlived its supervisor "
            f"(pid {sup[0]}); stopping it to restart it from its last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        for sig, wait_s in ((signal.SIGTERM, self.args.grace), (signal.SIGKILL, 30.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.time() + wait_s
            while time.time() < deadline and process_alive(pid):
                time.sleep(0.1)
            if not process_alive(pid):
                return

    def run_attempt(self, attempt: int, devices: int | None) -> dict:
        """Start the trainer once and watch it until it exits or is killed."""
        self.attempt_id, self.trainer_pid = f"{self.run_id}.{attempt}", None
        env = dict(
            os.environ,
            **{
                HEARTBEAT_ENV: self.heartbeat_file,
                EVENT_LOG_ENV: self.args.event_log,
                ATTEMPT_ENV: self.attempt_id,
                SUPERVISOR_PID_ENV: str(os.getpid()),
                SUPERVISOR_START_ENV: start_time(os.getpid()) or "",
                ORPHAN_GRACE_ENV: str(self.args.orphan_grace),
            },
        )
        if devices is not None:
            env[AVAILABLE_DEVICES_ENV] = str(devices)
        start = time.time()
        try:
            self.proc = subprocess.Popen(self.args.command, env=env, start_new_session=True, preexec_fn=die_with_parent)
        except OSError as err:  # found by `which` but cannot be run (permissions, a bad interpreter line)
            cli.fail("supervise", f"cannot start the trainer command {self.args.command[0]!r}: {err.strerror}")
        self.events.write(
            "child_start",
            attempt=attempt,
            attempt_id=self.attempt_id,
            child_pid=self.proc.pid,
            devices=devices,
            committed=committed_steps(self.args.checkpoint_dir),
            command=self.args.command,
        )
        info = {
            "attempt": attempt,
            "pid": self.proc.pid,
            "start": start,
            "first_step_time": None,
            "last_step": None,
            "last_progress": start,
            "phase": "start",
            "reason": None,
        }
        seen = None
        while True:
            rc = self.proc.poll()
            hb = read_json(self.heartbeat_file)
            now = time.time()
            if isinstance(hb, dict) and self._ours(hb) and hb != seen:
                seen, info["phase"], info["last_progress"] = hb, hb.get("phase"), now
                if hb.get("host", socket.gethostname()) == socket.gethostname() and hb.get("pid") != self.proc.pid:
                    self.trainer_pid = hb.get("pid")
                if hb.get("phase") in ("train", "final", "done", "preempted"):
                    info["last_step"] = hb.get("step")
                    info["first_step_time"] = info["first_step_time"] or now
            if rc is not None:
                break
            if self.stop_signal is not None and now - self.stop_time > self.args.grace:
                self.events.write("grace_expired", attempt=attempt, child_pid=self.proc.pid)
                info["reason"] = "killed after grace"
                rc = self._kill()
                break
            limit = self.args.heartbeat_timeout if info["phase"] == "train" else self.args.startup_timeout
            if self.stop_signal is None and now - info["last_progress"] > limit:
                self.events.write(
                    "hang_detected",
                    attempt=attempt,
                    child_pid=self.proc.pid,
                    phase=info["phase"],
                    last_step=info["last_step"],
                    silent_s=round(now - info["last_progress"], 1),
                )
                info["reason"] = "hang"
                rc = self._kill()
                break
            time.sleep(self.args.poll)
        info.update(rc=rc, end=time.time())
        if info["reason"] is None:
            if rc == 0:
                info["reason"] = "preempted" if info["phase"] == "preempted" else "done"
            elif rc in (EXIT_INTERRUPTED, -signal.SIGINT):  # Ctrl-C (twice) on the trainer: saved, not a crash
                info["reason"] = "interrupted"
            else:
                info["reason"] = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        info["committed"] = committed_steps(self.args.checkpoint_dir)
        # steps the trainer logged itself (a fault may end it after a step but before the heartbeat hook ran)
        reached = [
            int(r["step"])
            for r in read_events(self.args.event_log)
            if r.get("source") != "supervisor" and self._ours(r) and r.get("event") in _STEP_EVENTS and "step" in r
        ]
        if reached and (info["last_step"] is None or max(reached) > info["last_step"]):
            info["last_step"] = max(reached)
        self.events.write(
            "child_exit",
            attempt=attempt,
            attempt_id=self.attempt_id,
            child_pid=self.proc.pid,
            rc=rc,
            reason=info["reason"],
            last_step=info["last_step"],
            phase=info["phase"],
            committed=info["committed"],
            seconds=round(info["end"] - start, 1),
        )
        return info

    def _restored_step(self) -> int | None:
        """The step the current attempt's trainer resumed from (None if it did not get that far)."""
        for row in read_events(self.args.event_log):
            if (
                row.get("source") != "supervisor"
                and self._ours(row)
                and row.get("event") in ("restored", "fresh_start")
            ):
                return int(row.get("step", 0))
        return None

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.events.write(
            "supervisor_start",
            pid=os.getpid(),
            command=self.args.command,
            max_restarts=self.args.max_restarts,
            heartbeat_timeout=self.args.heartbeat_timeout,
        )
        self.take_over_orphan()
        attempt, no_progress, prev, devices_before, ok = 0, 0, None, None, False
        while True:
            devices = self._devices()
            if attempt and devices != devices_before:
                self.events.write("elastic_resize", devices_before=devices_before, devices=devices)
            devices_before = devices
            info = self.run_attempt(attempt, devices)
            self.stats["attempts"].append({k: info[k] for k in ("attempt", "pid", "rc", "reason", "last_step")})
            if prev is not None:  # account for the restart that led to this attempt
                restored = self._restored_step()
                if prev["last_step"] is not None and restored is not None:
                    self.stats["steps_lost"] += max(0, prev["last_step"] - restored)
                resumed_at = info["first_step_time"] or info["end"]
                self.stats["downtime_s"] += max(0.0, resumed_at - prev["last_progress"])
            made_progress = info["last_step"] is not None
            if info["reason"] == "done" or self.stop_signal is not None:
                ok = info["rc"] == 0
                break
            if info["rc"] == EXIT_BAD_INPUT:  # config / usage / data error: a restart would fail the same way
                self.events.write(
                    "give_up",
                    restarts=self.stats["restarts"],
                    last_reason=info["reason"],
                    why="the trainer reported bad input (exit 78); fix it and start again",
                )
                break
            if self.stats["restarts"] >= self.args.max_restarts:
                self.events.write("give_up", restarts=self.stats["restarts"], last_reason=info["reason"])
                break
            no_progress = 0 if made_progress else no_progress + 1
            reason = info["reason"]
            self.stats["by_reason"][reason] = self.stats["by_reason"].get(reason, 0) + 1
            delay = (
                0.0
                if reason in ("preempted", "interrupted")
                else min(self.args.backoff * 2**no_progress, self.args.max_backoff)
            )
            self.events.write("restart", attempt=attempt + 1, reason=info["reason"], backoff_s=delay)
            print(
                f"supervise: the trainer stopped ({info['reason']}, last logged step {info['last_step']}); restart "
                f"{self.stats['restarts'] + 1} of at most {self.args.max_restarts} in {delay:g} s",
                file=sys.stderr,
                flush=True,
            )
            self._sleep(delay)
            if self.stop_signal is not None:
                break
            self.stats["restarts"] += 1
            attempt, prev = attempt + 1, info
        summary = {
            "ok": ok,
            "final_step": info["last_step"],
            "committed": info["committed"],
            "restarts": self.stats["restarts"],
            "by_reason": self.stats["by_reason"],
            "steps_lost": self.stats["steps_lost"],
            "downtime_s": round(self.stats["downtime_s"], 1),
            "faults": [r["fault"] for r in read_events(self.args.event_log) if r.get("event") == "fault"],
            "stopped_by": self.stop_signal,
        }
        self.events.write("summary", **summary)
        print(json.dumps(summary, indent=2))
        if ok:
            return 0
        return EXIT_BAD_INPUT if info["rc"] == EXIT_BAD_INPUT else 1

    def _sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while self.stop_signal is None and time.time() < end:
            time.sleep(min(0.2, max(end - time.time(), 0.0)))


def main(argv: list[str]) -> None:
    """absl main: `argv[1:]` is the trainer command (absl stops parsing at `--`)."""
    sys.exit(Supervisor(settings(argv[1:])).run())


if __name__ == "__main__":
    cli.run(main, "supervise", jax_flags=False)
