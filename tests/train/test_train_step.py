"""Sharded train step: mesh invariance of loss and gradients, EP dispatch, ZeRO-1 memory, HLO checks."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from tests.tools.helpers import assert_trees_close, mean_loss_and_grads, random_batch, rel_err, tiny_config
from zaya_jax.config import ConfigError
from zaya_jax.model.zaya import Zaya
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import create_train_state, split_model
from zaya_jax.train.step import make_train_step

MESHES = [(8, 1), (2, 4), (1, 8)]  # all data, data × expert, all expert


def _config(data: int, expert: int, dispatch: str = "ep"):
    config = tiny_config(num_experts=8, dispatch=dispatch, capacity_factor=8.0)  # cf = E: nothing dropped
    # spread routing over experts: random router output weights of a useful scale
    config.mesh.data, config.mesh.expert = data, expert
    config.train.seq_len = 32
    return config


def _grads(config, devices):
    return mean_loss_and_grads(config, devices, random_batch(8, config.train.seq_len, config.model.vocab_size))


@pytest.fixture(scope="module")
def reference():
    """Single device, dense one-hot dispatch: the independent reference."""
    return _grads(_config(1, 1, "dense"), jax.devices()[:1])


@pytest.mark.parametrize("data,expert", MESHES)
def test_loss_and_grads_mesh_invariant(reference, data, expert):
    ref_loss, ref_grads, ref_counts, _ = reference
    dispatch = "ep" if expert > 1 else "capacity"
    devices = jax.devices()[: data * expert]
    loss, grads, counts, dropped = _grads(_config(data, expert, dispatch), devices)
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, f"mesh {data}x{expert}")
    np.testing.assert_array_equal(counts, ref_counts)
    assert int(np.sum(dropped)) == 0
    assert np.count_nonzero(ref_counts[:, :-1]) > 2, "routing should use several experts"


@pytest.mark.parametrize("dispatch", ["dropless", "capacity", "ep_ragged"])
def test_ep_equals_dense_and_dropless(reference, dispatch):
    """On the 2x4 mesh every dispatch gives the dense single-device result (`ep_ragged` at cf 8 ≥ 4 experts'
    devices: a receive buffer that holds every token)."""
    ref_loss, ref_grads, _, _ = reference
    loss, grads, _, _ = _grads(_config(2, 4, dispatch), jax.devices())
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, dispatch)


@pytest.mark.parametrize("dispatch", ["ep", "ep_ragged"])
def test_ep_drops_are_counted_when_capacity_is_small(dispatch):
    config = _config(2, 4, dispatch)
    config.model.capacity_factor = 0.25
    _, _, counts, dropped = _grads(config, jax.devices())
    assert int(np.sum(dropped)) > 0
    assert int(np.sum(dropped)) <= int(np.sum(counts[:, :-1]))


def _compiled_step(config):
    mesh = make_mesh(config)
    tx = make_optimizer(config)
    graphdef, state, shardings = create_train_state(config, mesh, tx)
    step = make_train_step(graphdef, tx, config, mesh, shardings)
    batch = random_batch(8, config.train.seq_len, config.model.vocab_size)
    with jax.set_mesh(mesh):
        return state, step.jitted.lower(state, batch).compile()


def test_hlo_has_all_to_all_and_no_expert_weight_all_gather():
    config = _config(2, 4)
    m = config.model
    _, compiled = _compiled_step(config)
    hlo = compiled.as_text()
    assert re.search(r"\ball-to-all\b", hlo), "expert tokens must move with all-to-all"
    full_expert = [
        (m.num_experts, m.hidden_size, 2 * m.moe_intermediate_size),
        (m.num_experts, m.moe_intermediate_size, m.hidden_size),
    ]
    for line in hlo.splitlines():
        if "all-gather" not in line or "=" not in line:
            continue
        shape_text = line.split("=", 1)[1].split("all-gather", 1)[0]
        for dims in re.findall(r"\[([\d,]+)\]", shape_text):
            dims = tuple(int(d) for d in dims.split(","))
            for full in full_expert:
                assert dims[-3:] != full, f"all-gather of full expert weights: {line.strip()[:200]}"


def test_zero1_optimizer_state_is_sharded_over_all_devices():
    def opt_bytes(mode):
        config = _config(8, 1, "capacity")
        config.train.param_sharding = mode
        mesh = make_mesh(config)
        _, state, _ = create_train_state(config, mesh, make_optimizer(config))
        leaves = [x for x in jax.tree.leaves(state.opt_state) if hasattr(x, "addressable_shards") and x.ndim]
        per_device = sum(x.addressable_shards[0].data.nbytes for x in leaves)
        return per_device, sum(x.nbytes for x in leaves)

    replicated, total = opt_bytes("replicated")
    zero1, _ = opt_bytes("zero1")
    assert replicated == total
    assert zero1 <= 1.1 * total / 8, f"ZeRO-1 keeps {zero1 / total:.3f} of the optimizer state per device"


def test_fsdp_shards_parameters():
    config = _config(8, 1, "capacity")
    config.train.param_sharding = "fsdp"
    mesh = make_mesh(config)
    _, state, _ = create_train_state(config, mesh, make_optimizer(config))
    leaves = [x for x in jax.tree.leaves(state.params) if x.ndim]
    per_device = sum(x.addressable_shards[0].data.nbytes for x in leaves)
    assert per_device <= 0.2 * sum(x.nbytes for x in leaves)


def test_loss_falls_over_30_steps_on_a_fixed_batch():
    config = _config(2, 4)
    config.optimizer.warmup_steps = 5
    config.train.steps = 30
    mesh = make_mesh(config)
    tx = make_optimizer(config)
    graphdef, state, shardings = create_train_state(config, mesh, tx)
    step = make_train_step(graphdef, tx, config, mesh, shardings)
    batch = random_batch(8, config.train.seq_len, config.model.vocab_size)
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses


def test_mesh_errors_are_clear():
    config = _config(3, 1)
    with pytest.raises(ConfigError, match="does not fit"):
        make_mesh(config)
    config = _config(1, 8)
    config.model.num_experts = 4
    with pytest.raises(ConfigError, match="not divisible by mesh.expert"):
        make_mesh(config)


def test_state_adopts_given_model_weights():
    config = _config(2, 4)
    model = Zaya(config.model, rngs=__import__("flax").nnx.Rngs(params=7))
    _, params, _ = split_model(model)
    mesh = make_mesh(config)
    _, state, _ = create_train_state(config, mesh, make_optimizer(config), model=model)
    assert_trees_close(jax.device_get(state.params), jax.device_get(params), 0.0, "adopted")


def test_masked_mean_gradients_over_microbatches():
    """The step's gradients (2 devices, 2 micro-batches, some positions and one whole row masked) equal
    `jax.grad` of a plainly written masked token-mean cross-entropy of the dense single-device model."""
    import jax.numpy as jnp
    from flax import nnx

    batch = random_batch(8, 32, 256)
    batch["loss_mask"][:, :5] = 0.0
    batch["loss_mask"][3] = 0.0
    reference_config = _config(1, 1, "dense")
    reference_config.train.z_loss = 0.0
    mesh = make_mesh(reference_config, jax.devices()[:1])
    graphdef, state, _ = create_train_state(reference_config, mesh, make_optimizer(reference_config))

    def masked_mean_ce(params):
        logits = nnx.merge(graphdef, params, state.biases)(jnp.asarray(batch["input_ids"]))
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.asarray(batch["labels"])[..., None], axis=-1)[..., 0]
        mask = jnp.asarray(batch["loss_mask"])
        return jnp.sum(nll * mask) / jnp.sum(mask)

    with jax.set_mesh(mesh):
        ref_loss, ref_grads = jax.device_get(jax.jit(jax.value_and_grad(masked_mean_ce))(state.params))
    config = _config(2, 1, "capacity")
    config.train.z_loss, config.train.microbatches = 0.0, 2
    loss, grads, _, _ = mean_loss_and_grads(config, jax.devices()[:2], batch)
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, "2 micro-batches, masked")


def test_step_reports_the_mean_gradient_norm_and_clips_by_it():
    """The GSPMD step's `grad_norm` is the float64 NumPy norm of the mean gradients (`mean_loss_and_grads`), and
    with `grad_clip_norm` below it the first AdamW moment is (1 − b1) · g · clip / norm."""
    config = _config(2, 1, "capacity")
    config.train.param_sharding, config.optimizer.grad_clip_norm = "replicated", 0.05
    batch = random_batch(8, config.train.seq_len, config.model.vocab_size)
    _, grads, _, _ = mean_loss_and_grads(config, jax.devices()[:2], batch)
    norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))
    mesh = make_mesh(config, jax.devices()[:2])
    tx = make_optimizer(config)
    graphdef, state, shardings = create_train_state(config, mesh, tx)
    state, metrics = make_train_step(graphdef, tx, config, mesh, shardings)(state, batch)
    assert rel_err(float(metrics["grad_norm"]), norm) <= 1e-5
    assert norm > 10 * config.optimizer.grad_clip_norm, "the test needs clipping to be active"
    adam = state.opt_state[1].inner_states["adam"].inner_state[0]  # (clip, partition{adam: masked(chain)})
    want = (1 - config.optimizer.adam_b1) * np.asarray(grads["embed"], np.float64) * 0.05 / norm
    np.testing.assert_allclose(np.asarray(adam.mu["embed"]), want, rtol=1e-4, atol=1e-12)
