"""Multi-process training through the launcher's distributed path: 2 processes × 4 emulated CPU devices
(`jax.distributed.initialize` with a localhost coordinator, gloo CPU collectives) train on one 8-device
global mesh and log the same losses as 1 process × 8 devices.

This is the code path a SLURM job takes (`launch/rocm/train.sbatch`: one process per node), with CPU
devices standing in for the 8 GPUs of a node.
"""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.checkpoint_helpers import REPO, data_dir, env_for, losses, train_cmd  # noqa: F401

STEPS = 3
RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(workdir: str, data: str, devices: int, *extra: str) -> list[str]:
    return train_cmd(workdir, data, devices, f"--config.train.steps={STEPS}", "--config.checkpoint.every=0",
                     *extra)


def _run_two_processes(workdir: str, data: str, timeout: float) -> list[str]:
    """Start processes 0 and 1 (4 devices each) against one coordinator; returns their stderr."""
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen(_cmd(workdir, data, 4, f"--coordinator_address={coordinator}", "--num_processes=2",
                                   f"--process_id={i}"),
                              cwd=REPO, env=env_for(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
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


@pytest.mark.slow
def test_two_processes_match_one_process(data_dir, tmp_path):  # noqa: F811
    reference = subprocess.Popen(_cmd(str(tmp_path / "one"), data_dir, 8), cwd=REPO, env=env_for(8),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:  # both runs at once: they are independent and mostly wait on compilation
        stderr = _run_two_processes(str(tmp_path / "two"), data_dir, timeout=600)
        ref_err = reference.communicate(timeout=600)[1]
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert reference.returncode == 0, ref_err[-4000:]
    for i, err in enumerate(stderr):  # the launcher really went through jax.distributed.initialize
        assert f"process {i} of 2, 8 global devices" in err, err[-2000:]

    one, two = losses(str(tmp_path / "one")), losses(str(tmp_path / "two"))  # process 0 writes the metrics
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    for step in one:
        (a,), (b,) = one[step], two[step]
        assert abs(a - b) <= RTOL * abs(a), (step, a, b)
