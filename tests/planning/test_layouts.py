"""The layouts a layout search enumerates and the expert-capacity model it picks capacity factors with."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tools.helpers import tiny_config
from zaya_jax.model.expert_parallel import receive_rows
from zaya_jax.model.experts import capacity
from zaya_jax.planning.layouts import (
    CAPACITY_GRID,
    Layout,
    dropped_fraction,
    enumerate_layouts,
    load_spread,
    receive_dropped_fraction,
)


def test_every_layout_keeps_the_batch_and_the_devices():
    config = tiny_config(num_experts=16)
    config.train.seq_len = 64
    layouts, left_out = enumerate_layouts(config, 16, 8, global_batch=32, max_dropped=0.05)
    assert layouts and all(lay.devices == 16 and lay.global_batch == 32 for lay in layouts)
    assert {lay.expert for lay in layouts} <= {1, 2, 4, 8}  # experts within a node of 8, dividing 16 experts
    assert {lay.context for lay in layouts} == {1}  # 64 tokens need no context parallelism
    assert all(lay.remat == "full" for lay in layouts if lay.overlap_collectives)  # what validate allows
    for lay in layouts:
        if lay.expert == 1:
            assert lay.dispatch == "dropless" and lay.capacity_factor == 1.0 and lay.expected_dropped == 0.0
        else:
            assert lay.dispatch == "ep_ragged" and lay.expected_dropped <= 0.05
    assert {(lay.data, lay.expert) for lay in layouts} >= {(16, 1), (8, 2), (4, 4), (2, 8)}
    assert all("capacity" in line for line in left_out)  # only families no capacity saves are left out


def test_long_sequences_also_try_context_parallelism():
    config = tiny_config()
    config.train.seq_len = 16_384
    layouts, _ = enumerate_layouts(config, 16, 8, global_batch=16)
    assert {lay.context for lay in layouts} == {1, 2, 4, 8}
    assert all(lay.expert * lay.context <= 8 for lay in layouts)


def test_overrides_set_what_the_trainer_reads():
    lay = Layout(2, 4, 1, microbatches=2, sequences=3, remat="dots", capacity_factor=1.5)
    config = lay.apply(tiny_config())
    assert (config.mesh.data, config.mesh.expert, config.mesh.context) == (2, 4, 1)
    assert config.train.global_batch_size == 2 * 4 * 2 * 3 and config.train.microbatches == 2
    assert (config.model.remat, config.model.dispatch, config.model.capacity_factor) == ("dots", "ep_ragged", 1.5)
    assert "--config.model.capacity_factor=1.5" in lay.train_flags()
    assert "--config.mesh.expert=4" in lay.train_flags()


@pytest.mark.parametrize("cf,sequences", [(1.0, 1), (1.5, 4), (2.0, 4), (1.25, 32)])
def test_dropped_fraction_matches_a_simulation_of_its_model(cf, sequences):
    """The closed form against NumPy: per-expert loads drawn from the model's normal distribution, overflow
    over ceil(cf·T/E) counted directly."""
    tokens, experts = 1024, 16
    mean = tokens / experts
    sigma = load_spread(tokens, experts, sequences, 0.45, 0.3)
    loads = np.random.default_rng(0).normal(mean, sigma * mean, size=(200_000, experts))
    over = np.maximum(loads - capacity(tokens, experts, cf), 0).sum(axis=1) / tokens
    assert dropped_fraction(cf, tokens, experts, sequences, 0.45, 0.3) == pytest.approx(over.mean(), rel=0.03, abs=1e-5)


@pytest.mark.parametrize("cf,devices,sequences", [(1.0, 8, 1), (1.25, 8, 2), (1.5, 8, 1), (1.25, 4, 4)])
def test_receive_dropped_fraction_matches_a_simulation_of_its_model(cf, devices, sequences):
    """`ep_ragged`'s receive buffers against NumPy: each expert's load in a group of `devices` drawn from the
    model's normal distribution, summed over a device's E/devices experts, overflow over ceil(cf·T) counted."""
    tokens, experts = 1024, 16
    group_mean = devices * tokens / experts
    sigma = load_spread(devices * tokens, experts, devices * sequences, 0.45, 0.3)
    loads = np.random.default_rng(0).normal(group_mean, sigma * group_mean, size=(100_000, experts))
    per_device = loads.reshape(-1, devices, experts // devices).sum(axis=2)
    over = np.maximum(per_device - receive_rows(tokens, devices, cf), 0).sum(axis=1) / (devices * tokens)
    model = receive_dropped_fraction(cf, tokens, experts, devices, sequences, 0.45, 0.3)
    assert model == pytest.approx(over.mean(), rel=0.03, abs=1e-5)


def test_a_receive_buffer_needs_less_capacity_than_per_expert_slots():
    """Pooling a device's experts over its group's sequences: the same drop at a smaller capacity factor (ZAYA1-base
    at 4k on nodes of 8: 1.5 against 1.75 for 2 sequences per device)."""
    for sequences in (1, 2, 4, 8):
        tokens = sequences * 4096
        for cf in CAPACITY_GRID:
            assert receive_dropped_fraction(cf, tokens, 16, 8, sequences) <= dropped_fraction(cf, tokens, 16, sequences)
    assert receive_dropped_fraction(1.5, 8192, 16, 8, 2) < 0.01 < dropped_fraction(1.5, 8192, 16, 2)


def test_the_model_reproduces_measured_drops():
    """Measured (README and benchmarks/balancing/README.md): the tiny example, one 128-token sequence per
    device, 16 experts, load CV 0.26, capacity factor 2 dropped 1.35% and 1.82%; the 100M config, 4 sequences of
    256 tokens per device, load CV ≈ 0.2, capacity factor 3 dropped ≤ 0.03%."""
    assert 0.01 <= dropped_fraction(2.0, 128, 16, 1, load_cv=0.26) <= 0.025
    assert dropped_fraction(3.0, 1024, 16, 4, load_cv=0.2) < 0.001
    drops = [dropped_fraction(cf, 4096, 16, 1) for cf in CAPACITY_GRID]
    assert drops == sorted(drops, reverse=True)
    assert dropped_fraction(1.5, 8 * 4096, 16, 8) < dropped_fraction(1.5, 4096, 16, 1)  # more sequences
