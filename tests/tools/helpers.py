"""Shared test helpers: small configs and relative-error checks."""

from __future__ import annotations

import jax
import numpy as np

from zaya_jax.config import load_config


def tiny_config(**model_overrides):
    """experiments/zaya1_tiny.py with model-field overrides."""
    config = load_config("experiments/zaya1_tiny.py")
    for key, value in model_overrides.items():
        config.model[key] = value
    return config


def rel_err(a, b) -> float:
    """max |a − b| / max |b| (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.max(np.abs(b))
    return float(np.max(np.abs(a - b)) / scale) if scale > 0 else float(np.max(np.abs(a)))


def assert_trees_close(a, b, rtol: float, what: str = "") -> None:
    """Per-leaf relative error ≤ rtol for two pytrees with the same structure."""
    paths_a = jax.tree_util.tree_flatten_with_path(a)[0]
    leaves_b = jax.tree.leaves(b)
    assert len(paths_a) == len(leaves_b), f"{what}: different tree structures"
    for (path, x), y in zip(paths_a, leaves_b):
        err = rel_err(x, y)
        assert err <= rtol, f"{what} {jax.tree_util.keystr(path)}: relative error {err:.3g} > {rtol}"


def random_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids in [3, vocab) (no pad/eos/bos), labels = next tokens, all positions counted."""
    ids = np.random.default_rng(seed).integers(3, vocab, (batch, seq + 1)).astype(np.int32)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": np.ones((batch, seq), np.float32)}


def mean_loss_and_grads(config, devices, batch: dict[str, np.ndarray]):
    """(mean CE, mean-per-token grads, expert counts [L, E+1], dropped [L]) of one step's loss on `batch`,
    with the train state created fresh (seed `train.seed`) on a mesh of `devices`; fetched to host."""
    from jax.sharding import NamedSharding

    from zaya_jax.parallel import sharding
    from zaya_jax.parallel.mesh import make_mesh
    from zaya_jax.train.optimizer import make_optimizer
    from zaya_jax.train.state import create_train_state
    from zaya_jax.train.step import loss_and_grads

    mesh = make_mesh(config, devices)
    graphdef, state, _ = create_train_state(config, mesh, make_optimizer(config))
    batch_sh = NamedSharding(mesh, sharding.batch_spec(2))

    @jax.jit
    def fn(params, biases, batch):
        grads, totals = loss_and_grads(graphdef, params, biases, batch, config)
        n = totals.loss.tokens
        return totals.loss.ce / n, jax.tree.map(lambda g: g / n, grads), totals.counts, totals.dropped

    with jax.set_mesh(mesh):
        batch = {k: jax.device_put(v, batch_sh) for k, v in batch.items()}
        return jax.device_get(fn(state.params, state.biases, batch))
