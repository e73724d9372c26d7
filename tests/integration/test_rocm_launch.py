"""launch/rocm: the SLURM scripts parse, build the per-node supervised trainer command, and env.sh's XLA
flags are names this jaxlib knows (XLA aborts on unknown flags). Nothing here needs a GPU or SLURM."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys

import pytest

from tests.tools import REPO

ROCM = os.path.join(REPO, "launch", "rocm")
SCRIPTS = ("env.sh", "node.sh", "train.sbatch")


def _bash(script: str, env: dict[str, str] | None = None, *args: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        ["bash", "-c", script, "bash", *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses(name):
    proc = subprocess.run(["bash", "-n", os.path.join(ROCM, name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_env_defaults_and_overrides():
    show = (
        "source launch/rocm/env.sh; "
        'echo "$JAX_LOCAL_DEVICE_IDS|$NCCL_IB_HCA|$XLA_PYTHON_CLIENT_MEM_FRACTION|$XLA_FLAGS"'
    )
    ids, hca, frac, xla = _bash(show).stdout.strip().split("|")
    assert ids == "0,1,2,3,4,5,6,7" and hca.startswith("ionic_0,") and frac == ".97"
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in xla
    ids, hca, _, xla = (
        _bash(show, {"GPUS_PER_NODE": "4", "NCCL_IB_HCA": "mlx5_0", "XLA_FLAGS": "--xla_dump_to=/tmp/x"})
        .stdout.strip()
        .split("|")
    )
    assert ids == "0,1,2,3" and hca == "mlx5_0" and xla.startswith("--xla_dump_to=/tmp/x ")


@pytest.mark.parametrize("env", ["launch/rocm/env.sh", "launch/cuda/env.sh"])
def test_env_xla_flags_are_known_to_this_xla(env):
    code = "import jax; print(len(jax.devices()))"
    proc = _bash(f"source {env}; JAX_PLATFORMS=cpu {shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    assert proc.returncode == 0 and "Unknown flag" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_gpu_check_lowering_flags_are_known_to_this_xla(platform):
    """launch.gpu_check runs a case with the platform's grouped-GEMM lowering flag: XLA must know its name."""
    from zaya_jax.bench.gpu_check.cases import GROUPED_LOWERING_FLAG

    code = "import jax; print(len(jax.devices()))"
    env = {"XLA_FLAGS": f"{GROUPED_LOWERING_FLAG[platform]}=true", "JAX_PLATFORMS": "cpu"}
    proc = _bash(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}", env)
    assert proc.returncode == 0 and "Unknown flag" not in proc.stderr, proc.stderr[-2000:]


def test_gpu_envs_set_the_kernels_lowering_and_overlap_flags():
    """The grouped-GEMM lowering `auto` relies on (ROCm) and the collective overlap both envs need."""
    rocm = _bash('source launch/rocm/env.sh; echo "$XLA_FLAGS"').stdout
    cuda = _bash('source launch/cuda/env.sh; echo "$XLA_FLAGS|$CUDA_DEVICE_MAX_CONNECTIONS"').stdout.strip()
    assert "--xla_gpu_experimental_use_ragged_dot_grouped_gemm=true" in rocm
    assert "--xla_gpu_all_gather_combine_threshold_bytes=1073741824" in rocm
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in cuda and cuda.endswith("|1")


def test_node_command_is_a_supervised_trainer_with_per_node_state():
    proc = _bash(
        'launch/rocm/node.sh "$@"',
        {"ZAYA_DRY_RUN": "1", "SLURM_NODEID": "3"},
        "experiments/zaya1_base.py:phase1",
        "/shared/run",
        "--config.train.steps=5",
    )
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    split = argv.index("--")
    sup, trainer = argv[:split], argv[split + 1 :]
    assert sup[:3] == ["python", "-m", "launch.supervise"]
    assert "--workdir=/shared/run/nodes/3" in sup and "--checkpoint_dir=/shared/run/checkpoints" in sup
    assert trainer[:3] == ["python", "-m", "launch.train"]
    for flag in (
        "--config=experiments/zaya1_base.py:phase1",
        "--workdir=/shared/run",
        "--config.checkpoint.dir=/shared/run/checkpoints",
        "--config.train.steps=5",
    ):
        assert flag in trainer, (flag, trainer)


def test_sbatch_starts_one_node_script_per_node(tmp_path):
    fake = tmp_path / "srun"  # stands in for SLURM's srun: records its arguments
    fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_LOG"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SRUN_LOG": str(tmp_path / "srun.log"), "SLURM_SUBMIT_DIR": REPO}
    workdir = str(tmp_path / "run")
    proc = _bash('launch/rocm/train.sbatch "$@"', env, "experiments/zaya1_tiny.py", workdir, "--config.train.steps=5")
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "srun.log").read_text().split("\n")
    assert "--ntasks-per-node=1" in args and os.path.join(ROCM, "node.sh") in args
    assert args[-4:-1] == ["experiments/zaya1_tiny.py", workdir, "--config.train.steps=5"]
    assert os.path.isdir(workdir)

    usage = _bash("launch/rocm/train.sbatch", env)
    assert usage.returncode == 2 and "usage" in usage.stderr
