"""The analytic side of the planner (`zaya_jax.planning.projection`): byte model, Newton–Schulz traffic, ZeRO-1 minimum,
checked against hand-computed values for small, explicit parameter trees."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.tools import REPO
from zaya_jax.config import load_config
from zaya_jax.planning import projection
from zaya_jax.planning.cluster import Cluster

TINY = os.path.join(REPO, "experiments", "zaya1_tiny.py")


def test_layer_bytes_of_zaya1_base():
    """ZAYA1-base dims (H 2048, C = 10·128 = 1280, R 256, E 16, I 2048) in bf16, cf 1, by hand."""
    m = load_config(os.path.join(REPO, "experiments", "zaya1_base.py")).model
    parts = projection.layer_bytes_per_token(m, 1.0)
    assert parts == {
        "norms": 2 * 6 * 2048,
        "merges": 2 * 10 * 2048,
        "cca": 12 * 1280 + 4 * 2048 + 6 * 1280,
        "router": 36 * 256 + 12 * 17,
        "dispatch": 8 * 2048,
        "swiglu": 6 * 2048,
    }
    assert sum(parts.values()) == 134_860


@pytest.fixture(scope="module")
def setup():
    """Tiny config on data:4 × expert:2 in bf16 with bf16 gradient reduction, and a 3-leaf parameter tree."""
    config = load_config(TINY)
    with config.unlocked():
        config.mesh.update(data=4, expert=2)
        config.model.dtype = "bfloat16"
        config.model.remat = "none"
        config.model.capacity_factor = 1.0
        config.train.update(global_batch_size=8, seq_len=64, microbatches=1, grad_reduce_dtype="bfloat16")
    mesh = jax.make_mesh((4, 2), ("data", "expert"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sds = lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))  # noqa
    params = {
        "layers": {
            "moe": {"w_in": sds((2, 4, 16, 32), P(None, "expert"))},  # 4096, EP-sharded
            "attn": {"wq": sds((2, 16, 16), P())},
        },  # 512, replicated
        "embed": sds((64, 16), P(None, "data")),
    }  # 1024, stored sharded (the compute copy is not)
    return config, params


def test_zero1_minimum_by_hand(setup):
    config, params = setup
    wire, time = projection.zero1_minimum(config, params, 8, Cluster())
    # w_in: 4096 / 2 expert shards = 2048 per device over r = 4 replicas; wq 512 and embed 1024 over r = 8;
    # gradients (bf16) and parameters (bf16) alike
    per_direction = 3 / 4 * 2048 * 2 + 7 / 8 * 512 * 2 + 7 / 8 * 1024 * 2
    assert wire["gradient_reduce_scatter"] == wire["parameter_all_gather"] == pytest.approx(per_direction)
    # EP: 64 tokens per device, 4 experts × ceil(64/4) = 64 rows × H 64 × 2 bytes = 8 KiB per all-to-all;
    # 2 layers × 2 all-to-alls × (forward + backward), each sending half of it off-device
    assert wire["expert_all_to_all"] == pytest.approx(2 * 2 * 2 * 0.5 * 64 * 64 * 2)
    assert wire["context_parallel"] == 0 and wire["total"] == pytest.approx(2 * per_direction + 8 * 4096)
    # priced: one reduce-scatter per replica class inside the one node (8 devices)
    cluster = Cluster()
    expected = cluster.reduce_scatter(2048 * 2, range(0, 8, 2)) + cluster.reduce_scatter(1536 * 2, range(8))
    assert time["gradient_reduce_scatter"].seconds == pytest.approx(expected.seconds)


def test_hbm_traffic_by_hand(setup):
    config, params = setup
    base = projection.hbm_traffic(config, params, 8, cf=1.0, ns_share=0.0)
    with config.unlocked():
        config.train.update(microbatches=4, global_batch_size=32)
    four = projection.hbm_traffic(config, params, 8, cf=1.0, ns_share=0.0)
    # the full fp32 gradient of this device's compute copy (2048 + 512 + 1024 elements) read + written
    # once per extra micro-batch, and cast to bf16 once per step
    assert base["gradient_accumulation"] == 0 and four["gradient_accumulation"] == 3 * 2 * 4 * 3584
    assert base["gradient_cast"] == four["gradient_cast"] == (4 + 2) * 3584
    assert four["layers_forward_backward"] == 4 * base["layers_forward_backward"]  # 4x the tokens per step
    assert base["layers_recompute"] == 0
    # optimizer shard: 1/8 of each parameter; Muon (w_in, wq: 4608) and Adam (embed: 1024) per element:
    # grad 2 + clip 2 + master 8 + bf16 copy 2, + momentum 8 + NS in/out 8 (Muon) or + 2 moments 16 (Adam)
    assert base["optimizer_update"] == pytest.approx(4608 / 8 * (14 + 16) + 1024 / 8 * (14 + 16))
    assert base["newton_schulz_exposed"] == 0 and base["total"] == pytest.approx(
        sum(v for k, v in base.items() if k not in ("total", "newton_schulz_operands"))
    )


def test_newton_schulz_bytes(setup):
    config, params = setup
    steps = config.optimizer.muon_ns_steps
    # w_in split into gate | up: 2·4·2 = 16 matrices of 16×16; wq: 2 matrices of 16×16
    operands, exposed = projection.ns_bytes(params, config)  # ridge = inf: nothing hides under compute
    assert operands == exposed == 18 * (steps * (3 * 256 + 4 * 256) + 2 * 256) * 4
    flops = projection.ns_flops(params, config)
    assert flops == 18 * steps * 6 * 16**3
    _, hidden = projection.ns_bytes(params, config, ridge=flops / operands)  # exactly at the ridge
    assert hidden == pytest.approx(0.0, abs=1e-6)
