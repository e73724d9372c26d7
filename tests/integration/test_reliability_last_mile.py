"""Reliability, the last mile (issue 43): each case as the issue reproduces it, with real signals and filesystems.

* a second Ctrl-C (a real second SIGINT 0.05 s after the first, and one landing in the end-of-run plot): the
  in-flight save commits, one line `train: interrupted: ...`, exit 130, no traceback;
* a full disk during a checkpoint write (a real tmpfs mount whose inodes run out, where the host allows mounting;
  else the error injected at the write): one line, exit 1 at once, the earlier checkpoint intact;
* `prepare_data` killed with its whole process group and rerun: no `*.tmp` left, output identical to an
  uninterrupted run; its launcher alone killed: no process of it left;
* refused / failed commands leave the user's folders as they were (`prepare_data`, `reshard --from_hf`,
  `plan --sweep=data:0`); an unknown config variant is one line without a traceback;
* a SIGSTOPped or GIL-hung trainer whose supervisor is SIGKILLed is ended by its sentinel.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from launch.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from tests.tools.checkpoint_helpers import REPO, data_dir, env_for, train_cmd  # noqa: F401 - data_dir is a fixture
from zaya_jax.checkpoint.events import read_events, read_json
from zaya_jax.checkpoint.lock import LOCK_NAME
from zaya_jax.checkpoint.orphan import process_alive


def _committed(ckpt_dir: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(ckpt_dir) if n.isdigit()) if os.path.isdir(ckpt_dir) else []


def _wait(predicate, timeout: float, poll: float = 0.01) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------- Ctrl-C twice
def _interrupt_twice(tmp_path, data_dir: str, second_when) -> tuple[subprocess.CompletedProcess, str]:
    """A 40-step run (checkpoint every 2): SIGINT once step 2 is committed, again when `second_when(workdir)` (a
    number: that many seconds later)."""
    if not callable(second_when):
        gap = float(second_when)
        second_when = lambda w, t0=[]: t0.append(time.time()) or time.time() - t0[0] >= gap  # noqa: E731
    workdir = str(tmp_path / "w")
    cmd = train_cmd(workdir, data_dir, 4, "--config.train.steps=40")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env_for(None), stderr=subprocess.PIPE, text=True)
    ckpts = os.path.join(workdir, "checkpoints")
    assert _wait(lambda: _committed(ckpts) or proc.poll() is not None, 600)
    proc.send_signal(signal.SIGINT)
    assert _wait(lambda: second_when(workdir) or proc.poll() is not None, 120, poll=0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", err), workdir


def _check_interrupted(proc: subprocess.CompletedProcess, workdir: str) -> None:
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]
    ckpts = os.path.join(workdir, "checkpoints")
    newest = _committed(ckpts)[-1]
    assert _last_line(proc.stderr) == f"train: interrupted: newest committed checkpoint: step {newest}"
    assert [n for n in os.listdir(ckpts) if not n.isdigit() and n != LOCK_NAME] == []  # no save left half-written
    rows = read_events(os.path.join(workdir, "events.jsonl"))
    assert not [r for r in rows if r["event"] == "abort_save_failed"], rows[-5:]
    saved = max(r["step"] for r in rows if r["event"] == "save")
    assert newest == saved  # the save in flight when the second SIGINT came committed


@pytest.mark.slow
def test_ctrl_c_twice_0_05_s_apart_commits_the_save_and_exits_cleanly(data_dir, tmp_path):
    """Exit 130 with one line; or, when both signals reach Python as one (CPython runs a handler once for signals
    of one kind that arrive while the main thread is in C code), the first Ctrl-C's path: save, exit 0."""
    proc, workdir = _interrupt_twice(tmp_path, data_dir, 0.05)
    if proc.returncode == 0:
        rows = read_events(os.path.join(workdir, "events.jsonl"))
        preempted = [r["step"] for r in rows if r["event"] == "preempted"]
        assert preempted == [_committed(os.path.join(workdir, "checkpoints"))[-1]], rows[-5:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return
    _check_interrupted(proc, workdir)


def test_a_second_sigint_during_a_save_acts_once_the_save_is_handed_over(tmp_path):
    """In process: the second SIGINT arrives while Orbax is being handed the preemption save; KeyboardInterrupt
    comes after, and the step commits."""
    import jax

    from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
    from zaya_jax.checkpoint import make_checkpointer
    from zaya_jax.parallel.mesh import make_mesh

    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    with config.unlocked():
        config.checkpoint.update(every=100, async_save=True)
    _, state = random_state(config, make_mesh(config))
    ck = make_checkpointer(config, str(tmp_path))  # installs its SIGINT handler (pytest runs tests in the main thread)
    try:
        state = ck.restore_or_keep(state, jax.tree.map(lambda x: x.sharding, state))
        save = ck.ckpt.save

        def save_hit_by_a_second_sigint(*args, **kwargs):
            ck._on_signal(signal.SIGINT, None)  # the second Ctrl-C, in the middle of the save call
            return save(*args, **kwargs)

        ck.ckpt.save = save_hit_by_a_second_sigint
        ck._on_signal(signal.SIGINT, None)  # the first: noted
        with pytest.raises(KeyboardInterrupt):
            ck.maybe_save(3, state, None, {"loss": 2.0, "grad_norm": 1.0})
        assert ck.interrupted
    finally:
        ck.abort()
    assert ck.ckpt.committed_steps() == [3]
    assert [r["step"] for r in read_events(str(tmp_path / "events.jsonl")) if r["event"] == "commit"] == [3]


@pytest.mark.slow
def test_ctrl_c_twice_landing_in_the_end_of_run_plot(data_dir, tmp_path):
    """The second SIGINT once the run has finished its final save (its heat-map plot imports matplotlib)."""

    def finished(workdir: str) -> bool:
        return any(r["event"] == "finish" for r in read_events(os.path.join(workdir, "events.jsonl")))

    proc, workdir = _interrupt_twice(tmp_path, data_dir, finished)
    _check_interrupted(proc, workdir)


# ---------------------------------------------------------------------------------------------- disk full
def _mount_tmpfs(path: str) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        return (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", path], capture_output=True).returncode
            == 0
        )
    except OSError:
        return False


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_write_is_one_line(data_dir, tmp_path):
    mount = str(tmp_path / "mnt")
    if not _mount_tmpfs(mount):
        _full_disk_injected(tmp_path)  # the host does not allow mounting: the error injected at the write
        return
    try:
        ckpts = os.path.join(mount, "ck")
        cmd = train_cmd(
            str(tmp_path / "w"),
            data_dir,
            4,
            "--config.train.steps=10",
            "--config.checkpoint.every=5",
            f"--config.checkpoint.dir={ckpts}",
        )
        proc = subprocess.Popen(cmd, cwd=REPO, env=env_for(None), stderr=subprocess.PIPE, text=True)
        assert _wait(lambda: _committed(ckpts) == [5] or proc.poll() is not None, 600)
        proc.send_signal(signal.SIGSTOP)  # between two saves: the next one finds the file system full
        st = os.statvfs(mount)
        subprocess.run(["mount", "-o", f"remount,nr_inodes={st.f_files - st.f_ffree + 2}", mount], check=True)
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=600)
        aborted = max(r["time"] for r in read_events(str(tmp_path / "w" / "events.jsonl")) if r["event"] == "abort")
        assert time.time() - aborted < 60  # not held up by Orbax's writer threads of the failed save
        assert proc.returncode == 1, err[-3000:]
        assert "Traceback" not in err and "ERROR:absl" not in err, err[-3000:]
        line = _last_line(err)
        assert line.startswith(f"train: error: saving checkpoint step 10 to {ckpts} failed: No space left on device")
        assert _committed(ckpts) == [5]
        from zaya_jax.checkpoint import Checkpointer

        assert Checkpointer(ckpts, read_only=True).read_meta(5)["step"] == 5  # intact (its checksum checked)
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _full_disk_injected(tmp_path) -> None:
    import jax.numpy as jnp

    from zaya_jax.checkpoint import Checkpointer, CheckpointError

    ck = Checkpointer(str(tmp_path / "ck"), async_save=False)
    state = {"w": jnp.ones((4, 4))}
    ck.save(1, state, {}, wait=True)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    ck.manager.save = full
    with pytest.raises(CheckpointError) as err:
        ck.save(2, state, {}, wait=True)
    assert "\n" not in str(err.value) and "failed: No space left on device" in str(err.value)
    assert ck.committed_steps() == [1]


# ------------------------------------------------------------------------------------------ prepare_data
def _prepare_cmd(out: str) -> list[str]:
    return [
        sys.executable, "-m", "launch.prepare_data", "--input=default", f"--output={out}", "--seq_len=32",
        "--shard_size=8", "--task_bytes=20000", "--workers=2", "--default_corpus_max_bytes=600000",
    ]  # fmt: skip


def _tasks_done(out: str) -> int:
    if not os.path.isdir(out):
        return 0
    return sum(os.path.exists(os.path.join(out, d, "done.json")) for d in os.listdir(out) if d.startswith("task-"))


def _digest(out: str) -> dict[str, str]:
    """sha256 of every prepared file (not the engine's logs or the lock)."""
    digests = {}
    for root, _, files in os.walk(out):
        if ".datatrove" in root:
            continue
        for name in files:
            if name != ".prepare.lock":
                with open(os.path.join(root, name), "rb") as f:
                    digests[os.path.relpath(os.path.join(root, name), out)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = (read_text(f"/proc/{entry}/stat") or ")").rsplit(")", 1)[-1].split()
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


@pytest.mark.slow
def test_prepare_data_after_a_process_group_kill_and_a_launcher_kill(tmp_path):
    reference, out = str(tmp_path / "reference"), str(tmp_path / "out")
    env = env_for(None)
    subprocess.run(_prepare_cmd(reference), cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    total = sum(1 for d in os.listdir(reference) if d.startswith("task-"))
    proc = subprocess.Popen(_prepare_cmd(out), cwd=REPO, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    assert _wait(lambda: _tasks_done(out) >= 3, 300)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, mid-task
    proc.wait()
    unfinished = [
        d
        for d in sorted(os.listdir(out))
        if d.startswith("task-") and not os.path.exists(os.path.join(out, d, "done.json"))
    ]
    assert unfinished and _tasks_done(out) < total
    with open(os.path.join(out, unfinished[0], "shard-00001.segments.npy.0badf00d.tmp"), "wb") as f:
        f.write(b"half a shard")  # what a kill in the middle of a write leaves (if this kill did not)
    # the rerun, killed at the launcher alone: none of its processes may outlive it
    proc = subprocess.Popen(_prepare_cmd(out), cwd=REPO, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    assert _wait(lambda: len(_descendants(proc.pid)) >= 2 or proc.poll() is not None, 300)
    helpers = _descendants(proc.pid)
    proc.kill()
    proc.wait()
    left = [pid for pid in helpers if not _wait(lambda pid=pid: not process_alive(pid), 20, poll=0.1)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the killed launcher still running: {left}"
    subprocess.run(_prepare_cmd(out), cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    tmp = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f.endswith(".tmp")]
    assert tmp == []
    assert _digest(out) == _digest(reference)


def _run(args: list[str], cwd: str = REPO) -> subprocess.CompletedProcess:
    env = dict(env_for(8), PYTHONPATH=REPO)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _one_line(proc: subprocess.CompletedProcess, prog: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == EXIT_BAD_INPUT and lines and lines[-1].startswith(f"{prog}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


def _listing(path: str) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(r, f), path): open(os.path.join(r, f), "rb").read()
        for r, _, fs in os.walk(path)
        for f in fs
    }


@pytest.mark.slow
def test_refused_and_failed_commands_leave_the_folders_as_they_were(tmp_path):
    prepare = [sys.executable, "-m", "launch.prepare_data", "--seq_len=16", "--workers=1"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    good = tmp_path / "in.jsonl"
    good.write_text('{"text": "hello"}\n')
    before = _listing(str(foreign))
    assert "not empty" in _one_line(_run([*prepare, f"--input={good}", f"--output={foreign}"]), "prepare_data")
    assert _listing(str(foreign)) == before and sorted(os.listdir(foreign)) == ["notes.txt"]
    inputs = {
        "empty.txt": b"",
        "malformed.jsonl": b'{"text": "a"}\n{oops\n',
        "binary.jsonl": bytes(range(256)) * 8,
    }
    for name, data in inputs.items():
        path = tmp_path / name
        path.write_bytes(data)
        new, empty = tmp_path / f"new_{name}", tmp_path / f"empty_{name}"
        empty.mkdir()
        for out in (new, empty):
            _one_line(_run([*prepare, f"--input={path}", f"--output={out}"]), "prepare_data")
        assert not new.exists(), f"{name}: left {sorted(os.listdir(new))}"
        assert os.listdir(empty) == [], f"{name}: left {os.listdir(empty)}"
    # plan --sweep=data:0: refused before writing plan_sweep/ into the working directory
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    plan = [sys.executable, "-m", "launch.plan", f"--config={REPO}/experiments/zaya1_tiny.py", "--sweep=data:0"]
    assert "data:0" in _one_line(_run(plan, cwd=str(cwd)), "plan")
    assert os.listdir(cwd) == []


@pytest.mark.slow
def test_reshard_from_a_truncated_hf_file_leaves_no_lock(tmp_path):
    import jax

    from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
    from zaya_jax import hf
    from zaya_jax.checkpoint import Checkpointer, load_model
    from zaya_jax.parallel.mesh import make_mesh

    config = tiny_mesh_config(dict(data=jax.device_count(), expert=1, context=1))
    ck = Checkpointer(str(tmp_path / "ck"), async_save=False)
    ck.save(2, random_state(config, make_mesh(config))[1], {"data": None, "config": config.to_dict()}, wait=True)
    ck.close()
    hf_dir = str(tmp_path / "hf")
    hf.save_pretrained(load_model(str(tmp_path / "ck"))[1], hf_dir)
    weights = os.path.join(hf_dir, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    for dst in (new, empty):
        line = _one_line(
            _run([sys.executable, "-m", "launch.reshard", f"--from_hf={hf_dir}", f"--dst={dst}"]), "reshard"
        )
        assert "model.safetensors" in line
    assert not new.exists() and os.listdir(empty) == []


def test_an_unknown_config_variant_is_one_line(tmp_path):
    proc = _run(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--config=experiments/zaya1.py:nosuchvariant",
            f"--workdir={tmp_path / 'w'}",
        ]
    )
    line = _one_line(proc, "train")
    assert "unknown variant 'nosuchvariant'; choose one of" in line and "config_flags.py" not in line, line
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------- a stopped trainer, a dead supervisor
_FAKE = """
import os, re, signal, sys, time
from zaya_jax.checkpoint.events import Heartbeat
from zaya_jax.checkpoint.orphan import watch_supervisor
stop = []
signal.signal(signal.SIGTERM, lambda *args: stop.append(1))  # as the trainer: noted, acted on after the step
watch_supervisor(poll_s=0.2)
hb = Heartbeat(os.environ["ZAYA_HEARTBEAT_FILE"])
hb(1)
if sys.argv[1] == "gil":  # a C call that never releases the GIL: no thread and no signal handler of it runs
    re.match(r"(a+)+$", "a" * 64 + "b")
while not stop:
    time.sleep(0.2)
"""


@pytest.mark.parametrize("hang", ["sigstop", "gil"])
def test_a_stopped_or_hung_trainer_ends_when_its_supervisor_is_killed(tmp_path, hang):
    workdir = str(tmp_path / "w")
    fake = tmp_path / "fake.py"
    fake.write_text(_FAKE)
    sup = subprocess.Popen(
        [sys.executable, "-m", "launch.supervise", f"--workdir={workdir}", "--poll=0.1", "--orphan_grace=2",
         "--", sys.executable, str(fake), hang],
        cwd=REPO, env=env_for(None), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        beat = os.path.join(workdir, "heartbeat.json")
        assert _wait(lambda: isinstance(read_json(beat), dict) and read_json(beat).get("phase") == "train", 120)
        trainer = int(read_json(beat)["pid"])
        if hang == "sigstop":
            os.kill(trainer, signal.SIGSTOP)
        else:
            time.sleep(0.5)  # in the regular expression by now
    finally:
        sup.kill()
        sup.wait()
    gone = _wait(lambda: not process_alive(trainer), 15, poll=0.1)
    if not gone:
        os.kill(trainer, signal.SIGKILL)
    assert gone, "the trainer outlived its SIGKILLed supervisor by 15 s"


def test_the_supervisor_reads_exit_130_as_an_interruption(tmp_path):
    """A trainer interrupted by a second Ctrl-C (exit 130) is restarted at once, not after a crash's backoff."""
    workdir = str(tmp_path / "w")
    once = tmp_path / "interrupted_once"
    child = (
        "import os, sys; from zaya_jax.checkpoint.events import Heartbeat; "
        "hb = Heartbeat(os.environ['ZAYA_HEARTBEAT_FILE']); hb(1); p = sys.argv[1]; "
        "first = not os.path.exists(p); open(p, 'w').close(); "
        "hb.beat(1, 'train' if first else 'done'); sys.exit(130 if first else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "launch.supervise", f"--workdir={workdir}", "--poll=0.05", "--backoff=60",
         "--", sys.executable, "-c", child, str(once)],
        cwd=REPO, env=env_for(None), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    restarts = [r for r in read_events(os.path.join(workdir, "events.jsonl")) if r["event"] == "restart"]
    assert [(r["reason"], r["backoff_s"]) for r in restarts] == [("interrupted", 0.0)]
