"""Checkpoint save throughput (the project's Orbax `Checkpointer`) vs raw sequential writes to the same disk.

The saved tree is a full TrainState (params, optimizer state, biases, balancing state) of the given
config, filled with random values (NumPy, fast) in its shardings. For each trial, alternately:

* raw: write one file of the same number of bytes in 64 MiB chunks, then `os.fsync` (and once more
  without fsync, the page-cache rate);
* checkpoint: `Checkpointer.save(step, state, meta, wait=True)` — from the call until the step is
  committed (device→host copy, serialisation, Orbax's tmp-dir + rename commit).

`ratio_vs_raw` = checkpoint MiB/s / raw (fsync) MiB/s, medians of the same run. Files are deleted after
each trial, so the page cache state is comparable.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from zaya_jax.bench import common
from zaya_jax.checkpoint.manager import Checkpointer, tree_nbytes
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import abstract_train_state

COLUMNS = (
    "kind",
    "bytes",
    "trials",
    "s_median",
    "s_min",
    "MiB_per_s",
    "ratio_vs_raw",
    "blocking_s_median",
    "directory",
)
CHUNK = 64 << 20


def random_state(config: ml_collections.ConfigDict, optimizer: str = "muon", seed: int = 0) -> Any:
    """A TrainState shaped and sharded like `create_train_state`'s, filled with random values."""
    mesh = make_mesh(config, jax.devices()[:1])
    tx = make_optimizer(config) if optimizer == "muon" else optax.adamw(1e-3)
    _, abs_state, _ = abstract_train_state(config, mesh, tx)
    rng = np.random.default_rng(seed)

    def fill(x):
        host = (
            rng.standard_normal(x.shape, np.float32).astype(x.dtype)
            if np.issubdtype(x.dtype, np.floating)
            else np.zeros(x.shape, x.dtype)
        )
        return jax.device_put(host, x.sharding)

    return jax.tree.map(fill, abs_state)


def raw_write(path: str, nbytes: int, fsync: bool = True) -> float:
    """Seconds to write `nbytes` sequentially to a new file (64 MiB chunks), with a final fsync if asked."""
    buf = np.random.default_rng(1).integers(0, 255, size=min(nbytes, CHUNK), dtype=np.uint8).tobytes()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[: min(left, len(buf))])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def benchmark(
    config: ml_collections.ConfigDict, directory: str | None = None, trials: int = 3, optimizer: str = "muon", log=print
) -> list[dict[str, Any]]:
    state = random_state(config, optimizer)
    jax.block_until_ready(state)
    nbytes = tree_nbytes(state)
    root = tempfile.mkdtemp(prefix="zaya_ckpt_bench_", dir=directory)
    times: dict[str, list[float]] = {"raw_fsync": [], "raw_no_fsync": [], "checkpoint": []}
    blocking: list[float] = []
    try:
        ckpt = Checkpointer(os.path.join(root, "ckpt"), keep=1, async_save=True)
        for i in range(trials):
            raw = os.path.join(root, "raw.bin")
            times["raw_fsync"].append(raw_write(raw, nbytes, fsync=True))
            os.remove(raw)
            times["raw_no_fsync"].append(raw_write(raw, nbytes, fsync=False))
            os.remove(raw)
            t0 = time.perf_counter()
            info = ckpt.save(i + 1, state, {"bench": True}, wait=True)
            times["checkpoint"].append(time.perf_counter() - t0)
            blocking.append(info["blocking_s"])
            log(
                f"checkpoint: trial {i}: raw {nbytes / 2**20 / times['raw_fsync'][-1]:.0f} MiB/s, "
                f"checkpoint {nbytes / 2**20 / times['checkpoint'][-1]:.0f} MiB/s"
            )
        ckpt.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for kind, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            dict(
                kind=kind,
                bytes=nbytes,
                trials=len(ts),
                s_median=med,
                s_min=min(ts),
                MiB_per_s=nbytes / 2**20 / med,
                directory=directory or tempfile.gettempdir(),
            )
        )
    raw = rows[0]["MiB_per_s"]
    for r in rows:
        r["ratio_vs_raw"] = common.ratio(r["MiB_per_s"], raw)
    rows[-1]["blocking_s_median"] = statistics.median(blocking)
    return rows


def run(
    out_dir: str, config: ml_collections.ConfigDict, *, command: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    rows = benchmark(config, log=common.say, **kwargs)
    m = config.model
    setup = (
        f"TrainState of hidden {m.hidden_size}, {m.num_layers} layers, {m.num_experts} experts: "
        f"{rows[0]['bytes'] / 2**20:.1f} MiB\n\n" + __doc__.split("\n\n", 1)[1]
    )
    return common.report(
        out_dir,
        "checkpoint",
        rows,
        title="Checkpoint save vs raw disk writes",
        table_columns=list(COLUMNS),
        csv_columns=COLUMNS,
        sections=[("Setup", setup)],
        notes=[f"checkpoint save / raw disk: {rows[-1]['ratio_vs_raw']:.2f}x"],
        command=command,
    )
