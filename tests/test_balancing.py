"""PID balancing-bias controller (docs/architecture.md §13.1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zaya_jax.config import default_config
from zaya_jax.train import balancing as bal

L, E, T = 2, 8, 2048  # layers, real experts, tokens per step in the synthetic router
C = E + 1


def make_cfg(**kw):
    cfg = default_config().balancing
    cfg.update(kw)
    return cfg


def random_counts(rng: np.random.Generator, steps: int, layers: int, classes: int) -> np.ndarray:
    counts = rng.integers(0, 50, size=(steps, layers, classes))
    counts[::5, 0, :] = 10  # exactly balanced rows: sign(0) = 0 for the experts when t_skip = 0
    counts[::5, 0, -1] = 0
    return counts


# ----------------------------------------------------------------------------- special cases, formula


@pytest.mark.parametrize("skip_controlled", [True, False])
def test_sign_rule_equals_deepseek_update(skip_controlled):
    gamma, e = 1e-3, 4
    cfg = make_cfg(error_shape="sign", kp=0.0, kd=0.0, ki=gamma, integral_clip=0.0, recenter=False,
                   normalize_by_target=False, target_skip=0.0, skip_controlled=skip_controlled)
    counts = random_counts(np.random.default_rng(0), 60, 3, e + 1)
    bias0 = np.zeros((3, e + 1), np.float32)
    bias0[:, -1] = -1.0
    # independent DeepSeek-V3 rule: b ← b + γ·sign(t − f)
    ref = bias0.astype(np.float64)
    target = np.array([1.0 / e] * e + [0.0])
    state = bal.init_balancing(jnp.asarray(bias0))
    update = jax.jit(lambda s, c: bal.update_biases(s, c, cfg))
    for c in counts:
        step = gamma * np.sign(target - c / c.sum(-1, keepdims=True))
        if not skip_controlled:
            step[:, -1] = 0.0
        ref = ref + step
        bias, state, _ = update(state, jnp.asarray(c, jnp.int32))
        np.testing.assert_allclose(bias, ref, atol=1e-6, rtol=0)
    assert np.any(ref != bias0)


def test_general_pid_formula_against_reference():
    cfg = make_cfg(error_shape="tanh", tanh_tau=0.05, kp=0.3, ki=0.02, kd=0.1, normalize_by_target=True,
                   integral_clip=2.0, recenter=True, target_skip=0.1, skip_controlled=True)
    counts = random_counts(np.random.default_rng(1), 25, 2, C)
    bias0 = np.random.default_rng(2).normal(size=(2, C)).astype(np.float32)
    t = np.array([0.9 / E] * E + [0.1])
    s_int, prev = np.zeros((2, C)), np.zeros((2, C))
    state = bal.init_balancing(jnp.asarray(bias0))
    for c in counts:
        f = c / c.sum(-1, keepdims=True)
        shaped = np.tanh((t - f) / 0.05) / t
        s_int = np.clip(s_int + shaped, -2.0, 2.0)
        s_int[:, :E] -= s_int[:, :E].mean(-1, keepdims=True)
        ref = bias0 + 0.3 * shaped + 0.02 * s_int + 0.1 * (shaped - prev)
        prev = shaped
        bias, state, _ = bal.update_biases(state, jnp.asarray(c), cfg)
        np.testing.assert_allclose(bias, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state.integral, s_int, rtol=1e-5, atol=1e-5)


def test_disabled_returns_base_and_keeps_state():
    bias0 = jnp.arange(C, dtype=jnp.float32)[None].repeat(L, 0)
    state = bal.init_balancing(bias0)
    bias, new_state, m = bal.update_biases(state, jnp.ones((L, C), jnp.int32), make_cfg(enabled=False))
    np.testing.assert_array_equal(bias, bias0)
    assert all(np.array_equal(a, b) for a, b in zip(state, new_state))
    assert m["load_cv"].shape == (L,)


def test_metrics_and_dropped_fraction():
    counts = np.array([[10, 30, 0, 60, 100], [25, 25, 25, 25, 0]])
    m = bal.load_metrics(jnp.asarray(counts))
    fe = counts[:, :-1] / counts[:, :-1].sum(-1, keepdims=True)
    np.testing.assert_allclose(m["load_cv"], fe.std(-1) / fe.mean(-1), rtol=1e-5)
    np.testing.assert_allclose(m["skip_fraction"], [0.5, 0.0])
    np.testing.assert_allclose(m["max_min_load_ratio"], [60.0, 1.0])  # idle expert counts as 1 token
    np.testing.assert_allclose(m["load"], counts / counts.sum(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(bal.dropped_fraction(jnp.array([10, 0]), jnp.asarray(counts)), [0.1, 0.0])


# ----------------------------------------------------------------------------- skewed synthetic router

# Fixed per-layer preferences (+ per-token N(0, 1) noise on the logits): layer 0 favours experts 0 and 1,
# layer 1 favours expert 5 strongly and expert 3 mildly. Skip logit 0, skip bias -1 (unreachable).
PREF = np.zeros((L, C), np.float32)
PREF[0, :2], PREF[1, 5], PREF[1, 3] = 2.0, 2.5, 1.0
BIAS0 = np.zeros((L, C), np.float32)
BIAS0[:, -1] = -1.0


def simulate(cfg, steps: int, pref=PREF, bias0=BIAS0, seed: int = 0):
    """Closed loop: choice = argmax(softmax(logits) + β) (ties → lowest index), counts → controller.

    Returns per-step (load_cv [steps, L], skip_fraction [steps, L], β after the step [steps, L, C]);
    the metrics of step k describe the choices made with the biases of step k − 1.
    """
    def body(carry, key):
        bias, state = carry
        probs = jax.nn.softmax(pref[:, None, :] + jax.random.normal(key, (L, T, C)), axis=-1)
        choice = jnp.argmax(probs + bias[:, None, :], axis=-1)
        counts = jax.vmap(lambda c: jnp.bincount(c, length=C))(choice)
        bias, state, m = bal.update_biases(state, counts, cfg)
        return (bias, state), (m["load_cv"], m["skip_fraction"], bias)

    b0 = jnp.asarray(bias0)
    run = jax.jit(lambda keys: jax.lax.scan(body, (b0, bal.init_balancing(b0)), keys)[1])
    return jax.tree.map(np.asarray, run(jax.random.split(jax.random.key(seed), steps)))


@pytest.mark.parametrize("gains, bound", [
    (dict(), 400),  # the defaults: DeepSeek sign rule, γ = ki = 1e-3 (β moves 1e-3 per step)
    (dict(error_shape="identity", normalize_by_target=True, kp=0.01, ki=0.002), 300),  # PI on relative error
])
def test_controller_balances_skewed_router(gains, bound):
    steps = bound + 150
    cv, skip, _ = simulate(make_cfg(**gains), steps)
    assert cv[0].min() > 1.0  # strongly unbalanced at the start
    for layer in range(L):
        below = np.nonzero(cv[:, layer] < 0.2)[0]
        assert below.size and below[0] <= bound, (layer, below[:3])
    assert cv[-100:].max() < 0.2  # and it stays balanced
    assert skip.max() == 0.0


def test_without_controller_load_stays_skewed():
    cv, _, bias = simulate(make_cfg(enabled=False), 100)
    assert cv.min() > 1.0
    np.testing.assert_array_equal(bias[-1], BIAS0)


def test_skip_slot_frozen_when_not_controlled():
    pref = PREF.copy()
    pref[:, -1] = 3.0  # the router likes to skip; with t_skip = 0.3 the skip slot is under target
    _, skip, bias = simulate(make_cfg(ki=5e-3, skip_controlled=False, target_skip=0.3), 200, pref=pref)
    np.testing.assert_array_equal(bias[:, :, -1], -1.0)  # frozen at its base value every step
    # (skip still gets traffic once the experts, all above their 0.7/E target, lower their biases)
    assert skip.max() > 0.0
    _, _, bias = simulate(make_cfg(ki=5e-3, skip_controlled=True, target_skip=0.3), 200, pref=pref)
    assert np.all(bias[-1, :, -1] > -1.0)  # controlled: raised toward its target


def test_skip_slot_controlled_toward_target():
    _, skip, bias = simulate(make_cfg(ki=5e-3, skip_controlled=True, target_skip=0.1), 350)
    assert skip[:20].max() == 0.0  # starts unreachable (β_E = -1)
    np.testing.assert_allclose(skip[-100:].mean(0), 0.1, atol=0.02)
    assert np.all(bias[-1, :, -1] > -1.0)
