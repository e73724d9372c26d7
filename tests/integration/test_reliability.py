"""Reliability: nothing committed is lost and every bad input gets one line (issue: reliability).

* workdir lock: a live holder is refused in one line naming it, a dead one's lock is taken over;
* checkpoints: every file of the newest step deleted, truncated or bit-flipped in turn → the restore returns
  that step bit-identical or falls back to the previous one (quarantine + console line), never a wrong state;
  checksums match an independent NumPy reference and do not depend on the mesh;
* supervisor: follows a trainer under a forking wrapper and one that left its process group, and does not
  restart a bad-input exit;
* layout: `check_layout` / the elastic shrink; SIGTERM between the save and the stop check; prepare_data;
* the `ci` cases of the adversarial bad-input set (tests/tools/reliability_cases.py; all: tests/tools/adversarial.py).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from launch.cli import EXIT_BAD_INPUT
from tests.tools.checkpoint_helpers import REPO, env_for, random_state, tiny_mesh_config
from tests.tools.reliability_cases import BAD_INPUTS, damaged_file_sweep, error_problem, make_context, run_bad_input
from zaya_jax.checkpoint import CheckpointConfigError, WorkdirLockedError, make_checkpointer
from zaya_jax.checkpoint.events import read_events
from zaya_jax.checkpoint.lock import LOCK_NAME, DirLock
from zaya_jax.config import ConfigError
from zaya_jax.parallel.mesh import make_mesh

# ------------------------------------------------------------------------------------------------ lock
_HOLDER = (
    "from zaya_jax.checkpoint.lock import DirLock; import sys, time; "
    "DirLock({'workdir': sys.argv[1]}, 'train').acquire(); print('held', flush=True); time.sleep(600)"
)


def test_workdir_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    workdir = str(tmp_path / "w")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, workdir],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirLockedError) as err:
            DirLock({"workdir": workdir}, "train").acquire()
        msg = str(err.value)
        assert f"pid {holder.pid} on " in msg and "in use by train" in msg and "\n" not in msg, msg
    finally:
        holder.kill()
        holder.wait()
    lock = DirLock({"workdir": workdir}, "train")
    stale = lock.acquire()  # the kernel dropped the dead holder's flock
    assert [r["pid"] for r in stale] == [holder.pid]
    again = DirLock({"workdir": workdir}, "reshard")
    assert again.acquire() == []  # re-entrant within one process
    again.release()
    lock.release()
    assert open(os.path.join(workdir, LOCK_NAME)).read() == ""  # released: no holder recorded
    with pytest.raises(CheckpointConfigError, match="is not a directory"):
        DirLock({"workdir": os.path.join(workdir, LOCK_NAME)}, "train").acquire()


def test_second_trainer_refuses_a_workdir_in_use(tmp_path):
    """The second trainer stops in one line before touching anything (an in-flight save of the first survives)."""
    workdir = str(tmp_path / "w")
    in_flight = os.path.join(workdir, "checkpoints", "4.orbax-checkpoint-tmp-1")
    os.makedirs(in_flight)
    lock = DirLock({"workdir": workdir}, "train")
    lock.acquire()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "launch.train", "--config=experiments/zaya1_tiny.py", f"--workdir={workdir}"],
            cwd=REPO,
            env=env_for(8),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        lock.release()
    assert error_problem(proc, "train") is None, proc.stderr[-2000:]
    assert f"is in use by train (pid {os.getpid()} on " in proc.stderr
    assert os.path.isdir(in_flight) and sorted(os.listdir(workdir)) == [LOCK_NAME, "checkpoints"]


# ------------------------------------------------------------------------------------------ checkpoints
def _np_fingerprint(x: np.ndarray) -> str:
    """Independent reference of `integrity._fingerprint` (module docstring formula) in NumPy uint64."""
    words = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]).astype(np.uint64).ravel()
    i = np.arange(words.size, dtype=np.uint64)
    m = np.uint64(2**32 - 1)
    h1 = int(np.sum((words * (2 * i + 1)) & m) & m)
    h = (words + i * np.uint64(0x9E3779B9)) & m
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        h = h ^ (h >> np.uint64(shift))
        if mult:
            h = (h * np.uint64(mult)) & m
    return f"{h1:08x}{int(np.sum(h) & m):08x}"


def test_checksums_match_a_numpy_reference_on_any_mesh():
    from zaya_jax.checkpoint import integrity

    rng = np.random.default_rng(0)
    host = {
        "a": rng.standard_normal((8, 6)).astype(np.float32),
        "b": rng.integers(0, 9, (16,)).astype(np.int32),
        "c": rng.standard_normal((8, 4, 2)).astype(jax.numpy.bfloat16),
    }
    mesh = jax.make_mesh((8,), ("data",))
    sharded = {k: jax.device_put(v, jax.NamedSharding(mesh, jax.P("data"))) for k, v in host.items()}
    one = {k: jax.device_put(v, jax.devices()[0]) for k, v in host.items()}
    want = {k: _np_fingerprint(v) for k, v in host.items()}
    assert {k: e[2] for k, e in integrity.manifest(sharded).items()} == want
    assert {k: e[2] for k, e in integrity.manifest(one).items()} == want
    flipped = host["a"].copy()
    flipped.view(np.uint32)[3, 2] ^= 1 << 30
    assert _np_fingerprint(flipped) != want["a"]


@pytest.mark.slow
def test_every_damaged_file_falls_back_to_the_newest_good_step(tmp_path, caplog):
    """Each file of the newest of two steps deleted / bit-flipped in turn (truncation too in tools/adversarial.py)."""
    with caplog.at_level(logging.WARNING):
        outcomes = damaged_file_sweep(str(tmp_path), ("delete", "bitflip"))
    for case in outcomes:
        assert case["problem"] is None, case
        if case["restored"] == 2:
            msg = case["console"]
            assert msg and "\n" not in msg and "<bound method" not in msg, case
    by = {(c["file"], c["mode"]): c for c in outcomes}
    assert by[("state/_METADATA", "delete")]["restored"] == 2  # the case: corrupt, not a config mismatch
    assert by[("meta/metadata", "bitflip")]["restored"] == 2  # the metadata has its own checksum
    assert any("do not match their checksums" in (c["console"] or "") for c in outcomes)  # bit flips Orbax misses


# ------------------------------------------------------------------------------------------- supervisor
_FAKE = """
import os, sys, time
from zaya_jax.checkpoint.events import EventLog, Heartbeat
hb = Heartbeat(os.environ["ZAYA_HEARTBEAT_FILE"], total_steps=5)
log = EventLog(os.environ["ZAYA_EVENT_LOG"], "trainer")
hb.beat(0, "start")
log.write("fresh_start", step=0)
for step in range(1, 6):
    time.sleep(0.7)
    hb(step)
    log.write("save", step=step)
    if step == 2 and sys.argv[1] == "hang":
        time.sleep(600)
hb.beat(5, "done")
"""


def _supervise(tmp_path, command: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    workdir = str(tmp_path / "w")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.supervise",
            f"--workdir={workdir}",
            "--poll=0.1",
            "--backoff=0.01",
            *extra,
            "--",
            *command,
        ],
        cwd=REPO,
        env=env_for(None),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, read_events(os.path.join(workdir, "events.jsonl"))


def test_supervisor_follows_a_trainer_under_a_forking_wrapper(tmp_path):
    """Heartbeats come from the grandchild: a run committing steps is neither a hang nor miscounted."""
    fake = tmp_path / "fake.py"
    fake.write_text(_FAKE)
    wrapper = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
    proc, rows = _supervise(
        tmp_path, [*wrapper, sys.executable, str(fake), "ok"], "--startup_timeout=2", "--heartbeat_timeout=2"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = rows[-1]
    assert summary["ok"] and summary["restarts"] == 0 and summary["final_step"] == 5, summary
    assert not any(r["event"] == "hang_detected" for r in rows)


def test_supervisor_kills_a_hung_trainer_outside_its_process_group(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text(_FAKE)
    setsid = [
        sys.executable,
        "-c",
        "import os, subprocess, sys; sys.exit(subprocess.call(sys.argv[1:], start_new_session=True))",
    ]
    proc, rows = _supervise(
        tmp_path, [*setsid, sys.executable, str(fake), "hang"], "--heartbeat_timeout=2", "--max_restarts=0"
    )
    hang = [r for r in rows if r["event"] == "hang_detected"]
    assert proc.returncode == 1 and len(hang) == 1 and hang[0]["last_step"] == 2, proc.stderr[-2000:]
    trainer = next(r["pid"] for r in rows if r["event"] == "save")
    with pytest.raises(ProcessLookupError):
        os.kill(trainer, 0)  # killed although it was in another session


def test_supervisor_does_not_restart_bad_input(tmp_path):
    proc, rows = _supervise(
        tmp_path, [sys.executable, "-c", f"import sys; sys.exit({EXIT_BAD_INPUT})"], "--max_restarts=5"
    )
    assert proc.returncode == EXIT_BAD_INPUT
    assert [r["event"] for r in rows].count("child_start") == 1
    assert any(r["event"] == "give_up" and "bad input" in r["why"] for r in rows)


# -------------------------------------------------------------------------------------------- layout
def test_check_layout_and_the_elastic_shrink(monkeypatch):
    from zaya_jax.checkpoint import elastic
    from zaya_jax.train.schedule import check_layout

    config = tiny_mesh_config(dict(data=-1, expert=1, context=1))
    check_layout(config, dict(data=8, expert=1, context=1))
    cases = [
        (dict(global_batch_size=7), dict(data=2, expert=1, context=1), "batch 7 is not divisible"),
        (dict(batch_ramp=((0, 8), (5, 12))), dict(data=4, expert=2, context=1), "step 5: batch 12"),
        (dict(microbatches=2), dict(data=8, expert=1, context=1), "train.microbatches 2 = 16"),
        (dict(seq_len=102), dict(data=2, expert=1, context=4), "seq_len=102 is not divisible by mesh.context=4"),
    ]
    for train, sizes, message in cases:
        bad = tiny_mesh_config({})
        bad.train.update(train)
        with pytest.raises(ConfigError, match=message) as err:
            check_layout(bad, sizes)
        assert "\n" not in str(err.value)
    assert elastic.shrink_mesh(config, 3) == dict(data=2, expert=1, context=1)  # batch 8 does not split 3 ways
    assert config.mesh.data == -1
    ctx = tiny_mesh_config(dict(data=-1, expert=2, context=2))
    assert elastic.shrink_mesh(ctx, 6) == dict(data=1, expert=2, context=2)  # 6 devices: 4 used, as much CP/EP kept
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "8")  # recorded, so the value use_devices sets is undone
    assert len(jax.devices()) == 8  # the backend runs: use_devices only changes what a new process sees
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "3,4,5,6")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    elastic.use_devices(2)
    assert os.environ["HIP_VISIBLE_DEVICES"] == "3,4" and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert os.environ["JAX_NUM_CPU_DEVICES"] == "2"  # jax's own option: wins over the count in XLA_FLAGS


# ------------------------------------------------------------------------------------------- preemption
def test_sigterm_between_save_check_and_stop_check_saves_first(tmp_path):
    """A signal is acted on at one point of `maybe_save`: the loop never sees `stop_requested` without a save."""
    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    with config.unlocked():
        config.checkpoint.update(every=100, async_save=False)
    _, state = random_state(config, make_mesh(config))
    ck = make_checkpointer(config, str(tmp_path), handle_signals=False)
    state = ck.restore_or_keep(state, jax.tree.map(lambda x: x.sharding, state))
    metrics = {"loss": 2.0, "grad_norm": 1.0}
    ck.maybe_save(1, state, None, metrics)
    ck._on_signal(signal.SIGTERM, None)  # after maybe_save returned: the loop's check must not see it yet
    assert not ck.stop_requested
    ck.maybe_save(2, state, None, metrics)
    assert ck.stop_requested and ck.ckpt.committed_steps() == [2]
    assert [r["step"] for r in read_events(str(tmp_path / "events.jsonl")) if r["event"] == "preempted"] == [2]
    ck2 = make_checkpointer(config, str(tmp_path), handle_signals=False)  # same process: the lock is re-entrant
    ck2.faults.process_faults = lambda step: ck2._on_signal(signal.SIGTERM, None)  # arrives after the save check
    ck2.restore_or_keep(state, jax.tree.map(lambda x: x.sharding, state))
    ck2.maybe_save(3, state, None, metrics)
    assert ck2.stop_requested and ck2.ckpt.committed_steps() == [2, 3]
    ck.finish(2, state)
    ck2.finish(3, state)


# ----------------------------------------------------------------------------------------- prepare_data
def test_prepare_data_warns_on_binary_and_a_failed_output_does_not_block_the_rerun(tmp_path):
    from zaya_jax.data.prepare import prepare
    from zaya_jax.data.tokenizer import DataError, DataWarning

    binary = tmp_path / "blob.txt"
    binary.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    with pytest.warns(DataWarning, match=r"blob.txt: \d+% of its bytes are not UTF-8"):
        prepare([str(binary)], str(tmp_path / "p0"), seq_len=16, progress=False)
    good = tmp_path / "in.jsonl"
    good.write_text('{"text": "hello"}\n{oops\n')
    out = str(tmp_path / "p1")
    with pytest.raises(DataError, match="invalid JSON"):
        prepare([str(good)], out, seq_len=16, progress=False)
    good.write_text('{"text": "hello"}\n{"text": "world"}\n')
    manifest = prepare([str(good)], out, seq_len=16, progress=False)
    assert manifest["num_documents"] == 2
    with pytest.raises(DataError, match="is not a directory"):
        prepare([str(good)], str(good), seq_len=16, progress=False)


def test_an_error_after_a_progress_bar_is_a_line_of_its_own(tmp_path):
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"text": "' + "x" * 5000 + '"}\n{oops\n')
    proc = subprocess.run(
        [sys.executable, "-m", "launch.prepare_data", f"--input={bad}", f"--output={tmp_path / 'out'}", "--seq_len=16"],
        cwd=REPO,
        env=env_for(None),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert error_problem(proc, "prepare_data") is None, proc.stderr
    assert "prepare out" in proc.stderr  # the bar was shown, and the error line still starts a line


# ---------------------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def context(tmp_path_factory):
    return make_context(str(tmp_path_factory.mktemp("adversarial")))


@pytest.mark.parametrize("case", [c for c in BAD_INPUTS if c.ci], ids=lambda c: c.name)
def test_bad_input_gets_one_line(case, context):
    start = time.time()
    proc = run_bad_input(case, context)
    problem = error_problem(proc, case.prog, expect=case.expect)
    assert problem is None, f"{case.name} ({time.time() - start:.0f}s): {problem}"


def test_train_cli_verbose_shows_the_traceback(context):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--config=experiments/zaya1_tiny.py",
            "--config.train.steps=-5",
            f"--workdir={context.root}/v",
            "--verbose",
        ],
        cwd=REPO,
        env=env_for(8),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == EXIT_BAD_INPUT and "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "train: error: train.steps=-5 must be an integer >= 1"
