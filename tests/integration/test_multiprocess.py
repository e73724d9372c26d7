"""Multi-process training through the launcher's distributed path: 2 processes × 4 emulated CPU devices
(`jax.distributed.initialize` with a localhost coordinator, gloo CPU collectives) posing as 2 nodes train on
one 8-device hybrid mesh (data across the nodes, expert inside each) and log the same losses as 1 process ×
8 devices.

Each process runs under its own `launch.supervise`, as on a SLURM cluster (`launch/rocm/train.sbatch` →
`launch/rocm/node.sh`: one supervised process per node), with CPU devices standing in for a node's 8 GPUs.
The SLURM auto-detection path (`srun` environment, no flags) is checked separately without training.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.tools.checkpoint_helpers import REPO, data_dir, env_for, losses, train_cmd  # noqa: F401
from zaya_jax.checkpoint.events import read_events, read_json

STEPS = 3
RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(workdir: str, data: str, devices: int, *extra: str) -> list[str]:
    """2 data × 4 expert: on 2 processes a hybrid mesh whose expert axis stays inside each "node"."""
    return train_cmd(
        workdir,
        data,
        devices,
        f"--config.train.steps={STEPS}",
        "--config.checkpoint.every=0",
        "--config.mesh.data=2",
        "--config.mesh.expert=4",
        "--config.model.dispatch=ep",
        *extra,
    )


def _node_command(workdir: str, data: str, coordinator: str, node: int) -> list[str]:
    """What `launch/rocm/node.sh` runs on node `node`: the trainer under its own supervisor, whose workdir
    (heartbeat, event log) is per node while metrics and checkpoints are shared."""
    trainer = _cmd(
        workdir, data, 4, f"--coordinator_address={coordinator}", "--num_processes=2", f"--process_id={node}"
    )
    return [
        sys.executable,
        "-m",
        "launch.supervise",
        f"--workdir={workdir}/nodes/{node}",
        f"--checkpoint_dir={workdir}/checkpoints",
        "--max_restarts=0",
        "--heartbeat_timeout=300",
        "--startup_timeout=600",
        "--",
        *trainer,
    ]


def _wait_all_ok(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Wait for every process (killing stragglers on the way out); assert each exited 0; their stderr."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, (proc, err) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"process {i} exited {proc.returncode}:\n{err[-4000:]}"
    return outputs


def _run_two_nodes(workdir: str, data: str, timeout: float) -> list[str]:
    """Start nodes 0 and 1 (4 devices each) against one coordinator; returns their stderr."""
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            _node_command(workdir, data, coordinator, i),
            cwd=REPO,
            env=env_for(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    return _wait_all_ok(procs, timeout)


@pytest.mark.slow
def test_two_processes_match_one_process(data_dir, tmp_path):  # noqa: F811
    reference = subprocess.Popen(
        _cmd(str(tmp_path / "one"), data_dir, 8),
        cwd=REPO,
        env=env_for(8),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    two = str(tmp_path / "two")
    try:  # both runs at once: they are independent and mostly wait on compilation
        stderr = _run_two_nodes(two, data_dir, timeout=600)
        ref_err = reference.communicate(timeout=600)[1]
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert reference.returncode == 0, ref_err[-4000:]
    for i, err in enumerate(stderr):  # the launcher really went through jax.distributed.initialize
        assert f"process {i} of 2, 8 global devices (4 local)" in err, err[-2000:]
        # each node's supervisor saw its own trainer's heartbeat (not only process 0's) and a clean finish
        beat = read_json(os.path.join(two, "nodes", str(i), "heartbeat.json"))
        summary = read_events(os.path.join(two, "nodes", str(i), "events.jsonl"))[-1]
        assert beat["phase"] == "done" and beat["step"] == STEPS, beat
        assert summary["event"] == "summary" and summary["ok"] and summary["final_step"] == STEPS, summary

    one, two = losses(str(tmp_path / "one")), losses(two)  # process 0 writes the metrics
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    for step in one:
        (a,), (b,) = one[step], two[step]
        assert abs(a - b) <= RTOL * abs(a), (step, a, b)


# ------------------------------------------------------------------ SLURM auto-detection (no training)

_INIT_ONLY = """
import sys
from absl import flags
from launch import train
flags.FLAGS(["train", "--config=experiments/zaya1_tiny.py", "--workdir=unused", "--cpu_devices=4"])
train._maybe_initialize_distributed()
import jax
print("RESULT", jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count())
"""


def _slurm_env(proc_id: int, port: int, **extra: str) -> dict[str, str]:
    """What `srun --nodes=2 --ntasks-per-node=1` exports (both "nodes" are localhost here)."""
    return env_for(
        4,
        SLURM_JOB_ID="4242",
        SLURM_STEP_NODELIST="localhost",
        SLURM_NTASKS="2",
        SLURM_NTASKS_PER_NODE="1",
        SLURM_PROCID=str(proc_id),
        SLURM_LOCALID="0",
        JAX_COORDINATOR_PORT=str(port),
        **extra,
    )


@pytest.mark.slow
def test_slurm_environment_initializes_distributed_without_flags():
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _INIT_ONLY],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_slurm_env(i, port, SLURM_GPUS_ON_NODE="8"),
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-3000:]
        assert f"RESULT {i} 2 8 4" in out, out + err[-2000:]
        # 4 visible devices for a node that SLURM says has 8 GPUs: the launcher warns about JAX_LOCAL_DEVICE_IDS
        assert "JAX_LOCAL_DEVICE_IDS" in err, err[-2000:]


def test_slurm_ntasks_outside_srun_is_a_clear_error():
    env = env_for(4, SLURM_JOB_ID="4242", SLURM_NTASKS="2")  # sbatch sets these; only srun adds SLURM_STEP_*
    proc = subprocess.run(
        [sys.executable, "-c", _INIT_ONLY], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0 and "srun" in proc.stderr and "coordinator_address" in proc.stderr, proc.stderr[-2000:]


_PREEMPT_STEPS = 200  # far more steps than the preemption notice needs to arrive


@pytest.mark.slow
def test_sigterm_on_one_process_stops_all_at_the_same_step(data_dir, tmp_path):  # noqa: F811
    """Only process 1 is preempted (after step 1); jax's preemption service tells both processes, they save
    the same step together and exit 0 — nobody hangs in a collective the other never joins."""
    workdir = str(tmp_path / "preempt")
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = []
    for i in range(2):
        cmd = train_cmd(
            workdir,
            data_dir,
            4,
            f"--config.train.steps={_PREEMPT_STEPS}",
            "--config.checkpoint.every=0",
            f"--coordinator_address={coordinator}",
            "--num_processes=2",
            f"--process_id={i}",
        )
        faults = {"ZAYA_FAULTS": "sigterm@1"} if i == 1 else {}
        procs.append(
            subprocess.Popen(
                cmd, cwd=REPO, env=env_for(4, **faults), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
    _wait_all_ok(procs, timeout=600)
    preempted = [e for e in read_events(os.path.join(workdir, "events.jsonl")) if e["event"] == "preempted"]
    # stopped early, after the notice (it reaches the other process through jax's coordination service a few
    # steps later: on a fast host 8 tiny steps can finish before it arrives, hence the long run)
    assert len(preempted) == 1 and 2 <= preempted[0]["step"] < _PREEMPT_STEPS, preempted
    stop = preempted[0]["step"]
    assert sorted(losses(workdir)) == list(range(1, stop + 1))
    assert sorted(n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()) == [str(stop)]
