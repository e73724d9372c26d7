"""fp32 losses and gradient norms of the tiny model over 30 steps, for the step-refactor identity check.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=SRC python identity.py OUT.json

Runs from whatever `zaya_jax` is importable (SRC: the tree before or after a change) and uses only the
public setup API (`zaya_jax.train.setup.prepare`), so the same script drives both trees. Cases: one device and
2 data × 4 expert; ZeRO-1 and FSDP; 1 and 4 micro-batches; ZeRO-1 also with `model.remat=full` (its fused
backward accumulation) and with `train.overlap_collectives` (the scattering backward pass). Compare two outputs with
`cmp` or `python -c 'import json,sys; ...'`: equal means bit-identical float32 values.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from zaya_jax.config import load_config
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train.setup import prepare

# 4 layers × 16 experts: owner layouts with layer chunks on 2 × 4 devices (tests/test_zero1_overlap.py)
OVERLAP = {
    "model.remat": "full",
    "model.num_layers": 4,
    "model.num_experts": 16,
    "model.capacity_factor": 16.0,
    "train.overlap_collectives": True,
}
CASES = [
    # name, data, expert, param_sharding, microbatches, extra overrides (remat=none is the default: plain
    # autodiff; remat=full: the ZeRO-1 step's fused backward accumulation; overlap: its scattering pass)
    ("1dev_fsdp_mb1", 1, 1, "fsdp", 1, {}),
    ("1dev_fsdp_mb4", 1, 1, "fsdp", 4, {}),
    ("1dev_zero1_mb1", 1, 1, "zero1", 1, {}),
    ("1dev_zero1_mb4", 1, 1, "zero1", 4, {}),
    ("1dev_zero1_mb4_remat", 1, 1, "zero1", 4, {"model.remat": "full"}),
    ("2x4_fsdp_mb1", 2, 4, "fsdp", 1, {}),
    ("2x4_fsdp_mb4", 2, 4, "fsdp", 4, {}),
    ("2x4_zero1_mb1", 2, 4, "zero1", 1, {}),
    ("2x4_zero1_mb4", 2, 4, "zero1", 4, {}),
    ("2x4_zero1_mb1_remat", 2, 4, "zero1", 1, {"model.remat": "full"}),
    ("2x4_zero1_mb4_remat", 2, 4, "zero1", 4, {"model.remat": "full"}),
    ("2x4_zero1_mb1_overlap", 2, 4, "zero1", 1, OVERLAP),
    ("2x4_zero1_mb4_overlap", 2, 4, "zero1", 4, OVERLAP),
]
STEPS = 30


def run(data, expert, param_sharding, microbatches, extra):
    config = load_config("experiments/zaya1_tiny.py")
    config.model.dtype = "float32"
    config.mesh.data, config.mesh.expert = data, expert
    config.train.param_sharding = param_sharding
    config.train.microbatches = microbatches
    config.train.seq_len = 32
    config.train.global_batch_size = 32
    for key, value in extra.items():
        section, field = key.split(".")
        config[section][field] = value
    mesh = make_mesh(config, jax.devices()[: data * expert])
    training = prepare(config, mesh)
    if training.zero1 is not None and extra.get("train.overlap_collectives"):
        assert any(g.slots.chunks > 1 for g in training.zero1.layout.groups), "no layer chunks: nothing overlaps"
    state, rng = training.state, np.random.default_rng(0)
    losses, norms = [], []
    for _ in range(STEPS):
        ids = rng.integers(3, config.model.vocab_size, (32, 33)).astype(np.int32)
        batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "loss_mask": np.ones((32, 32), np.float32)}
        state, metrics = training.step(state, batch)
        losses.append(float(metrics["loss"]).hex())
        norms.append(float(metrics["grad_norm"]).hex())
    return {"loss": losses, "grad_norm": norms}


def main(out: str) -> None:
    results = {name: run(*rest) for name, *rest in CASES}
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    for name, r in results.items():
        print(name, float.fromhex(r["loss"][0]), float.fromhex(r["loss"][-1]), float.fromhex(r["grad_norm"][-1]))


if __name__ == "__main__":
    main(sys.argv[1])
