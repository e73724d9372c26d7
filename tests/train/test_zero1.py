"""The ZeRO-1 step: owner layouts for any device count, gradients and updates equal to single-device
references, and the compiled program doing only the collectives it must (checked on its HLO)."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh

from tests.tools.helpers import assert_trees_close, mean_loss_and_grads, random_batch, rel_err, tiny_config
from zaya_jax.config import default_config
from zaya_jax.model.zaya import abstract_model
from zaya_jax.parallel.mesh import AXES, make_mesh
from zaya_jax.planning import hlo_stats
from zaya_jax.planning.hlo_text import parse_computations
from zaya_jax.train.optimizer import NS_SCOPE
from zaya_jax.train.setup import prepare, prepare_abstract
from zaya_jax.train.state import split_model
from zaya_jax.train.zero1 import layout as zero1
from zaya_jax.train.zero1.owners import ns_flops
from zaya_jax.train.zero1.step import make_zero1_grads

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _config(data: int, expert: int = 1, **model):
    config = tiny_config(**{"num_experts": 8, "capacity_factor": 8.0, **model})  # cf = E: EP drops nothing
    config.mesh.data, config.mesh.expert = data, expert
    config.train.seq_len = 32
    config.train.global_batch_size = 8 if (data * expert) % 3 else 6
    return config


def _batch(config, seed: int = 0):
    return random_batch(config.train.global_batch_size, config.train.seq_len, config.model.vocab_size, seed)


def _setup(config):
    mesh = make_mesh(config, jax.devices()[: int(config.mesh.data) * int(config.mesh.expert)])
    return mesh, prepare(config, mesh)


# ----------------------------------------------------------------------------- owner layouts


@pytest.mark.parametrize("devices", [3, 8, 64, 96, 1000, 1024])
def test_owner_layout_of_zaya1_base_for_any_device_count(devices):
    """Every Muon matrix of ZAYA1-base (40 layers × 16 experts × gate/up/down + the dense ones) has exactly one
    owner slot; Newton–Schulz work per device is within 10% of the mean although 40 and 16 don't divide n."""
    config = default_config()
    params = split_model(abstract_model(config.model))[1]
    mesh = AbstractMesh((devices, 1, 1), AXES)
    (group,) = zero1.build_layout(config, mesh, params).groups
    slots = group.slots
    per_layer = [seg.matrix for b in slots.bins for seg in b]
    assert sum(m.leaf.endswith("w_in") for m in per_layer) == 2 * 16  # gate and up orthogonalised separately
    assert sum(m.leaf.endswith("w_out") for m in per_layer) == 16
    assert len(set(per_layer)) == len(per_layer)  # no matrix twice
    assert slots.slots == -(-slots.num_bins // devices) and slots.num_bins == 40 * slots.bins_per_layer
    load = slots.ns_flops_per_device(5)
    needed = 40 * sum(ns_flops(m.rows, m.cols, 5) for m in per_layer)
    assert load.sum() == pytest.approx(needed)
    assert load.max() / load.mean() <= 1.1
    assert slots.padding_fraction() < 0.06
    assert group.flat.padded - group.flat.size < devices


# ----------------------------------------------------------------------------- numerics vs references


@pytest.fixture(scope="module")
def references():
    """Dense dispatch on one device: loss and mean gradients for the 8- and 6-row batches."""
    out = {}
    for rows in (8, 6):
        config = _config(1, dispatch="dense")
        config.train.global_batch_size = rows
        out[rows] = mean_loss_and_grads(config, jax.devices()[:1], _batch(config))
    return out


@pytest.mark.parametrize(
    "data,expert,remat",
    # all data; data × expert; owners that do not divide the matrices (3 devices) with remat
    [(8, 1, "none"), (2, 4, "none"), (3, 1, "full")],
)
def test_zero1_gradients_equal_single_device_dense(references, data, expert, remat):
    """remat=full: the layers' gradients are accumulated inside the backward pass (train.fused_backward)."""
    config = _config(data, expert, remat=remat)
    mesh, training = _setup(config)
    loss, grads, counts, dropped = jax.device_get(
        make_zero1_grads(training.graphdef, training.zero1, config, mesh)(training.state, _batch(config))
    )
    ref_loss, ref_grads, ref_counts, _ = references[config.train.global_batch_size]
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, f"mesh {data}x{expert}")
    np.testing.assert_array_equal(counts, ref_counts)
    assert int(np.sum(dropped)) == 0


def test_zero1_gradients_with_context_parallelism():
    """1 data × 4 context (zigzag) × 2 expert, fused accumulation: the sequence split over devices changes
    nothing."""
    config = _config(1, 2, remat="full")
    config.mesh.context, config.mesh.context_layout, config.train.seq_len = 4, "zigzag", 64
    mesh = make_mesh(config)
    training = prepare(config, mesh)
    reference = _config(1, dispatch="dense")
    reference.train.seq_len = 64
    batch = _batch(reference)
    ref_loss, ref_grads, ref_counts, _ = mean_loss_and_grads(reference, jax.devices()[:1], batch)
    loss, grads, counts, dropped = jax.device_get(
        make_zero1_grads(training.graphdef, training.zero1, config, mesh)(training.state, batch)
    )
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, "context x expert")
    np.testing.assert_array_equal(counts, ref_counts)


def _train(config, steps: int = 2):
    mesh, training = _setup(config)
    state, losses = training.state, []
    for k in range(steps):
        state, metrics = training.step(state, _batch(config, seed=k))
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(training.to_checkpoint(state))


# uneven owners (3 devices), and the pipelined update's 2 layer chunks (4 devices); the 2 × 4 gradients are
# checked above
@pytest.mark.parametrize("data,expert,chunks", [(3, 1, 1), (4, 1, 2)])
def test_zero1_updates_equal_single_device_optimizer(data, expert, chunks):
    """Two steps of distributed Muon + AdamW (owner slots, flat shards, clipping over all devices; per layer
    chunk Newton–Schulz and all-gather) equal the per-parameter optax optimizer on one device: same losses,
    same parameters and optimizer state."""

    def config_for(d, e, sharding):
        config = _config(d, e)
        config.optimizer.update(schedule="constant", warmup_steps=0, grad_clip_norm=0.05)  # clipping active
        config.train.param_sharding = sharding
        config.train.global_batch_size = 6 if data % 3 == 0 else 8
        return config

    config = config_for(data, expert, "zero1")
    mesh = AbstractMesh((data, 1, expert), AXES)
    (group,) = zero1.build_layout(config, mesh, split_model(abstract_model(config.model))[1]).groups
    assert group.slots.chunks == chunks
    losses, state = _train(config)
    ref_losses, ref_state = _train(config_for(1, 1, "replicated"))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    # gradients agree to ~1e-6 (test above); AdamW divides by sqrt(v) + eps per element, which turns that into
    # relative differences of up to ~1e-3 in the updates of elements whose gradients are near eps (embedding
    # rows of rare tokens), i.e. up to 1.0e-4 of the parameters' scale (3 devices, AMD EPYC; 2.4e-5 on 2 × 4)
    assert_trees_close(state.params, ref_state.params, 3e-4, "params")
    assert_trees_close(state.opt_state, ref_state.opt_state, 1e-4, "optimizer state")
    assert int(state.step) == 2


def test_auto_dispatch_drops_nothing_when_the_router_is_skewed():
    """data:8, `auto`: every token routed to expert 0 by the balancing bias — nothing is dropped (per-device
    dropless GEMMs); the capacity dispatch on the same batch would drop."""

    def skewed(dispatch):
        config = _config(8, dispatch=dispatch, capacity_factor=1.0)
        config.balancing.enabled = False
        mesh, training = _setup(config)
        bias = np.zeros((config.model.num_layers, config.model.num_experts + 1), np.float32)
        bias[:, 0] = 10.0  # p + β is largest for expert 0 whatever p is
        biases = jax.tree.map(lambda x: jax.device_put(bias, x.sharding), training.state.biases)
        _, metrics = training.step(training.state._replace(biases=biases), _batch(config))
        return jax.device_get(metrics)

    metrics = skewed("auto")
    assert np.all(metrics["load"][:, 0] == 1.0)
    np.testing.assert_array_equal(metrics["dropped_fraction"], 0.0)
    assert np.all(skewed("capacity")["dropped_fraction"] > 0.5)


def test_checkpoint_form_moves_between_device_counts():
    """The canonical (per-parameter) form of a data:8 ZeRO-1 state restores onto data:3 and converts back
    unchanged; the restored run trains on."""
    _, training8 = _setup(_config(8))
    canonical = jax.device_get(training8.to_checkpoint(training8.state))
    config3 = _config(3)
    _, training3 = _setup(config3)
    target = training3.checkpoint_target
    placed = jax.tree.map(lambda x, t: jax.device_put(x, t.sharding), canonical, target)
    state3 = training3.from_checkpoint(placed)
    assert_trees_close(jax.device_get(training3.to_checkpoint(state3)), canonical, 0.0, "8 -> 3 devices")
    _, metrics = training3.step(state3, _batch(config3))
    assert np.isfinite(float(metrics["loss"]))


# ----------------------------------------------------------------------------- the compiled program


def _lowered(config):
    from zaya_jax.planning.abstract_step import abstract_batch

    mesh = make_mesh(config, jax.devices()[: int(config.mesh.data) * int(config.mesh.expert)])
    training = prepare_abstract(config, mesh)
    with jax.set_mesh(mesh):
        return training.step.jitted.lower(training.state, abstract_batch(config, mesh)), training


@pytest.fixture(scope="module")
def odd_hlo():
    """3 layers × 3 experts on data:8 (8 divides neither)."""
    config = _config(8, num_layers=3, num_experts=3)
    lowered, _ = _lowered(config)
    return lowered.compile().as_text()


def _reachable(comps, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for instr in comps[name]:
            todo += [c for c, _ in hlo_stats.callees(instr, comps)]
    return seen


def test_no_collective_inside_newton_schulz(odd_hlo):
    comps, _ = parse_computations(odd_hlo)
    ns_loops = []
    for instrs in comps.values():
        for instr in instrs:
            if instr.opcode != "while":
                continue
            body = _reachable(comps, re.search(r"body=%?([\w.\-]+)", instr.attrs).group(1))
            if any(NS_SCOPE in i.attrs for c in body for i in comps[c]):
                ns_loops.append(body)
                assert not [i.opcode for c in body for i in comps[c] if i.opcode.split("-start")[0] in COLLECTIVES]
    assert ns_loops, "the owners' Newton-Schulz loop was not found"


def test_gradients_are_reduce_scattered_not_all_reduced(odd_hlo):
    stats = hlo_stats.analyze(odd_hlo, 8)
    assert stats.collectives["reduce-scatter"].count >= 1 and stats.collectives["all-gather"].count >= 1
    params = sum(
        x.size for x in jax.tree.leaves(nnx.state(abstract_model(_config(8, num_layers=3, num_experts=3).model)))
    )
    all_reduce = stats.collectives.get("all-reduce")
    assert all_reduce is None or all_reduce.operand_bytes < 0.01 * 4 * params  # loss sums, counts, norm only


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gradient_reduction_runs_in_grad_reduce_dtype(dtype):
    config = _config(4)
    config.train.grad_reduce_dtype = dtype
    text = _lowered(config)[0].as_text()
    element = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    scatters = re.findall(r'"stablehlo\.reduce_scatter".*?\}\) : \(tensor<([^>]*)>\)', text, flags=re.DOTALL)
    assert scatters and all(s.endswith(element) for s in scatters), scatters


def test_collective_bytes_do_not_grow_with_microbatches():
    def wire(microbatches):
        config = _config(2)
        config.train.global_batch_size, config.train.microbatches = 8, microbatches
        return hlo_stats.analyze(_lowered(config)[0].compile().as_text(), 2).collective_bytes

    assert wire(4) == wire(1) > 0


def test_every_dot_of_the_bf16_step_takes_bf16_operands():
    config = _config(2, dtype="bfloat16")
    text = _lowered(config)[0].as_text()
    dots = re.findall(r"stablehlo\.dot_general.*?:\s*\(tensor<([^>]*)>, tensor<([^>]*)>\)", text)
    # the gradient norm's Σ g² (`optimizer.squared_norm`) is one rank-1 dot g·g per fp32 gradient shard
    norm_dots = [(a, b) for a, b in dots if a == b and a.count("x") == 1]
    assert norm_dots and all(a.endswith("f32") for a, _ in norm_dots), norm_dots
    operands = [o for o in dots if o not in norm_dots]
    assert len(operands) > 20
    assert all(a.endswith("bf16") and b.endswith("bf16") for a, b in operands), [
        o for o in operands if not (o[0].endswith("bf16") and o[1].endswith("bf16"))
    ][:5]
