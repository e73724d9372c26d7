"""Shared helpers for the checkpoint / fault-tolerance tests: trainer subprocesses on N emulated CPU devices.

Every training run uses the same tiny config (seq 32, batch 8, 8 steps, HF-native skip), so runs on the
same device count compile the same programs. Subprocesses use `--xla_backend_optimization_level=0` (half
the CPU compile time; results are compared only between runs with the same flags) and a persistent XLA
compilation cache (`$ZAYA_TEST_XLA_CACHE`, default `<tmp>/zaya_jax_test_xla_cache`) shared between the
subprocesses of a session and across sessions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.tools import REPO

XLA_CACHE = os.environ.get("ZAYA_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "zaya_jax_test_xla_cache")
STEPS = 8
CONFIG = "experiments/zaya1_tiny.py"
_SCRUB = (
    "ZAYA_FAULTS",
    "ZAYA_AVAILABLE_DEVICES",
    "ZAYA_EVENT_LOG",
    "ZAYA_HEARTBEAT_FILE",
    "XLA_FLAGS",
    "JAX_NUM_CPU_DEVICES",
)


def config_overrides(data_dir: str, *, every: int = 2) -> list[str]:
    """`--config.*` flags of the test config (also accepted by `launch.reshard --config=...`)."""
    return [
        f"--config={CONFIG}",
        "--config.train.seq_len=32",
        "--config.train.global_batch_size=8",
        f"--config.train.steps={STEPS}",
        "--config.train.log_every=1",
        "--config.optimizer.warmup_steps=2",
        "--config.model.skip_output=zero",
        "--config.model.capacity_factor=16",  # >= num_experts: expert-parallel dispatch drops nothing on any mesh
        f"--config.data.cache_dir={data_dir}",
        "--config.data.default_corpus_max_bytes=200000",
        "--config.data.eval_fraction=0",
        f"--config.checkpoint.every={every}",
        "--config.checkpoint.keep=100",
    ]


def env_for(devices: int | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    flags = "--xla_backend_optimization_level=0"
    if devices:
        flags = f"--xla_force_host_platform_device_count={devices} {flags}"
    env.update(
        XLA_FLAGS=flags,
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=XLA_CACHE,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        PYTHONWARNINGS="ignore",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.update(extra)
    return env


def train_cmd(workdir: str, data_dir: str, devices: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.train",
        f"--workdir={workdir}",
        f"--cpu_devices={devices}",
        *config_overrides(data_dir),
        *extra,
    ]


def run(
    cmd: list[str], devices: int | None, *, expect_rc: int | None = 0, timeout: float = 900, **env: str
) -> subprocess.CompletedProcess:
    """Run `cmd` in the repo with `devices` emulated CPU devices; assert its exit status unless expect_rc is None."""
    proc = subprocess.run(cmd, cwd=REPO, env=env_for(devices, **env), capture_output=True, text=True, timeout=timeout)
    if expect_rc is not None and proc.returncode != expect_rc:
        raise AssertionError(
            f"{' '.join(cmd[:4])} exited {proc.returncode} (expected {expect_rc}):\n{proc.stderr[-4000:]}"
        )
    return proc


def metric_rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(workdir: str) -> dict[int, list[float]]:
    """Every recorded loss per step (a resumed run may record a step twice)."""
    out: dict[int, list[float]] = {}
    for row in metric_rows(workdir):
        if "loss" in row:
            out.setdefault(row["step"], []).append(row["loss"])
    return out


def events(workdir: str) -> list[dict]:
    from zaya_jax.checkpoint.events import read_events

    return read_events(os.path.join(workdir, "events.jsonl"))


def read_state(ckpt_dir: str, step: int | None = None) -> dict[str, np.ndarray]:
    """Every leaf of a saved TrainState as NumPy, keyed by path (restored onto one device)."""
    import jax

    from zaya_jax.checkpoint.model_io import load_train_state, open_checkpoint
    from zaya_jax.keys import path_name
    from zaya_jax.parallel.mesh import make_mesh

    ck, step, _, config = open_checkpoint(ckpt_dir, step)
    ck.close()
    config.mesh.update(dict(data=1, expert=1, context=1))
    mesh = make_mesh(config, devices=jax.devices()[:1])
    _, _, _, _, state, _ = load_train_state(ckpt_dir, mesh, config=config, step=step)
    return {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def tiny_mesh_config(mesh_sizes: dict):
    """experiments/zaya1_tiny.py with `config.mesh` set to `mesh_sizes`."""
    from tests.tools.helpers import tiny_config

    config = tiny_config()
    config.mesh.update(mesh_sizes)
    return config


def random_state(config, mesh, seed: int = 0):
    """(host NumPy tree, device TrainState) of random values with the config's shapes, dtypes and shardings."""
    import jax

    from zaya_jax.train.optimizer import make_optimizer
    from zaya_jax.train.state import abstract_train_state

    _, abstract, _ = abstract_train_state(config, mesh, make_optimizer(config))
    rng = np.random.default_rng(seed)
    host = jax.tree.map(
        lambda a: rng.standard_normal(a.shape).astype(a.dtype) if a.shape else np.asarray(7, a.dtype), abstract
    )
    return host, jax.tree.map(lambda h, a: jax.device_put(h, a.sharding), host, abstract)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
    """The small default-corpus cache shared by all trainer subprocesses of the session."""
    from zaya_jax.data import corpus

    root = str(tmp_path_factory.mktemp("ckpt_data"))
    out = corpus.default_corpus_dir(root, 32, "byte", 200_000)
    corpus.prepare_default_corpus(out, 32, "byte", 200_000, eval_fraction=0.0, progress=False)
    return root
