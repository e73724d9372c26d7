"""A trainer never outlives its supervisor, and a new supervisor takes over the trainer of a dead one.

* SIGKILL the supervisor: its trainer is gone within 20 s — through the parent-death signal (a direct child
  that does not watch), the trainer's own watchdog (under a wrapper the signal does not reach), and SIGKILL
  after `--orphan_grace` (a trainer that ignores SIGTERM);
* a live trainer whose supervisor is dead is stopped by the next supervisor on that workdir, which then runs
  its own; a trainer nobody supervises is left alone (exit 78, as before);
* slow: the real trainer (tiny config) — SIGKILL its supervisor, no trainer within 20 s, and a new supervisor
  resumes the run from its last checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from launch.cli import EXIT_BAD_INPUT
from tests.tools.checkpoint_helpers import REPO, config_overrides, data_dir, env_for  # noqa: F401
from zaya_jax.checkpoint.events import read_events, read_json
from zaya_jax.checkpoint.lock import holder
from zaya_jax.checkpoint.orphan import process_alive

# argv: workdir, watch|nowatch, steps, term|ignore_term
_FAKE = """
import os, signal, sys, time
from zaya_jax.checkpoint.errors import WorkdirLockedError
from zaya_jax.checkpoint.events import Heartbeat
from zaya_jax.checkpoint.lock import DirLock
from zaya_jax.checkpoint.orphan import watch_supervisor
try:
    DirLock({"workdir": sys.argv[1]}, "train").acquire()
except WorkdirLockedError as err:
    print("fake: error:", err, file=sys.stderr)
    sys.exit(78)
if sys.argv[4] == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[2] == "watch":
    watch_supervisor(poll_s=0.2)
hb = Heartbeat(os.environ.get("ZAYA_HEARTBEAT_FILE") or os.path.join(sys.argv[1], "heartbeat.json"))
steps = int(sys.argv[3])
for step in range(1, steps + 1):
    hb(step)
    time.sleep(0.2)
hb.beat(steps, "done")
"""
_WRAPPER = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]


def _fake(tmp_path, workdir: str, mode: str, steps: int, term: str = "term") -> list[str]:
    fake = tmp_path / "fake.py"
    fake.write_text(_FAKE)
    return [sys.executable, str(fake), workdir, mode, str(steps), term]


def _supervisor(workdir: str, command: list[str], *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "launch.supervise", f"--workdir={workdir}", "--poll=0.1", "--backoff=0.01"]
    return subprocess.Popen(
        [*args, *extra, "--", *command],
        cwd=REPO,
        env=env_for(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trainer_pid(workdir: str, timeout: float = 120) -> int:
    """The pid in the heartbeat of the trainer (the process that beats, whatever wraps it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        hb = read_json(os.path.join(workdir, "heartbeat.json"))
        if isinstance(hb, dict) and hb.get("attempt_id") and hb.get("phase") == "train":
            return int(hb["pid"])
        time.sleep(0.1)
    raise AssertionError("the trainer never beat")


def _gone_within(pid: int, seconds: float) -> float | None:
    start = time.time()
    while time.time() - start < seconds:
        if not process_alive(pid):
            return time.time() - start
        time.sleep(0.1)
    return None


def _assert_gone_within_20_s(trainer: int) -> None:
    """The trainer of a killed supervisor exits within 20 s (killed here if not, so no test leaves it behind)."""
    took = _gone_within(trainer, 20)
    if took is None:
        os.kill(trainer, signal.SIGKILL)
    assert took is not None, "the trainer outlived its supervisor by 20 s"


@pytest.mark.parametrize(
    "wrapped, mode, term",
    [(False, "nowatch", "term"), (True, "watch", "term"), (True, "watch", "ignore_term")],
    ids=["parent_death_signal", "watchdog_under_a_wrapper", "sigkill_after_grace"],
)
def test_a_sigkilled_supervisor_leaves_no_trainer(tmp_path, wrapped, mode, term):
    workdir = str(tmp_path / "w")
    command = _fake(tmp_path, workdir, mode, 100_000, term)
    sup = _supervisor(workdir, [*_WRAPPER, *command] if wrapped else command, "--orphan_grace=3")
    try:
        trainer = _trainer_pid(workdir)
    finally:
        sup.kill()
        sup.communicate()
    _assert_gone_within_20_s(trainer)
    if mode == "watch":
        assert any(r["event"] == "supervisor_lost" for r in read_events(os.path.join(workdir, "events.jsonl")))


def test_a_new_supervisor_takes_over_the_trainer_of_a_dead_one(tmp_path):
    workdir = str(tmp_path / "w")
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan_env = dict(env_for(None), ZAYA_SUPERVISOR_PID=str(dead.pid), ZAYA_SUPERVISOR_START="1")
    orphan = subprocess.Popen(_fake(tmp_path, workdir, "nowatch", 100_000), cwd=REPO, env=orphan_env)
    try:
        deadline = time.time() + 60
        while holder(workdir) is None and time.time() < deadline:
            time.sleep(0.1)
        assert holder(workdir)["supervisor"] == [dead.pid, "1"]
        sup = _supervisor(workdir, _fake(tmp_path, workdir, "watch", 3), "--grace=10")
        _, err = sup.communicate(timeout=120)
        assert sup.returncode == 0, err[-2000:]
        assert orphan.wait(timeout=10) == -signal.SIGTERM  # stopped cleanly first, not killed
        rows = read_events(os.path.join(workdir, "events.jsonl"))
        takeover = [r for r in rows if r["event"] == "takeover"]
        assert [r["trainer_pid"] for r in takeover] == [orphan.pid], rows
        assert rows[-1]["event"] == "summary" and rows[-1]["ok"] and rows[-1]["final_step"] == 3
        assert f"its trainer (pid {orphan.pid}) outlived its supervisor" in err
    finally:
        orphan.kill()
        orphan.wait()


def test_an_unsupervised_trainer_is_not_taken_over(tmp_path):
    workdir = str(tmp_path / "w")
    env = {k: v for k, v in env_for(None).items() if not k.startswith("ZAYA_SUPERVISOR")}
    user_run = subprocess.Popen(_fake(tmp_path, workdir, "nowatch", 100_000), cwd=REPO, env=env)
    try:
        deadline = time.time() + 60
        while holder(workdir) is None and time.time() < deadline:
            time.sleep(0.1)
        sup = _supervisor(workdir, _fake(tmp_path, workdir, "watch", 3))
        _, err = sup.communicate(timeout=120)
        assert sup.returncode == EXIT_BAD_INPUT and "is in use by train" in err, err[-2000:]
        assert user_run.poll() is None  # left running
    finally:
        user_run.kill()
        user_run.wait()


@pytest.mark.slow
def test_the_real_trainer_dies_with_its_supervisor_and_resumes_under_the_next(data_dir, tmp_path):
    workdir = str(tmp_path / "w")
    overrides = [o for o in config_overrides(data_dir) if not o.startswith("--config.train.steps")]
    command = [sys.executable, "-m", "launch.train", *overrides, "--config.train.steps=400", f"--workdir={workdir}"]
    sup = subprocess.Popen(
        [sys.executable, "-m", "launch.supervise", f"--workdir={workdir}", "--poll=0.2", "--", *command],
        cwd=REPO,
        env=env_for(8),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpts = os.path.join(workdir, "checkpoints")
    try:
        trainer = _trainer_pid(workdir, timeout=300)
        deadline = time.time() + 300
        while not any(n.isdigit() for n in os.listdir(ckpts)) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        sup.kill()
        sup.communicate()
    _assert_gone_within_20_s(trainer)
    last = max(int(n) for n in os.listdir(ckpts) if n.isdigit())
    assert 0 < last < 400
    resumed = [c if not c.startswith("--config.train.steps") else f"--config.train.steps={last + 2}" for c in command]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.supervise", f"--workdir={workdir}", "--poll=0.2", "--", *resumed],
        cwd=REPO,
        env=env_for(8),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_events(os.path.join(workdir, "events.jsonl"))
    restored = [r["step"] for r in rows if r["event"] == "restored"]
    assert restored and restored[-1] == last, (restored, last)
