"""Expert-balancing controller (`zaya_jax.train.balancing`): the formula against NumPy references, and
closed-loop simulations with synthetic routers (no training)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zaya_jax.config import ConfigError, default_config, validate_balancing
from zaya_jax.train import balancing as bal

L, E, T = 2, 8, 512  # layers, real experts, tokens per step in the synthetic router
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


# ----------------------------------------------------------------------------- formula, special cases


@pytest.mark.parametrize("skip_controlled, target_skip", [(False, 0.0), (True, 0.1)])
def test_sign_rule_equals_deepseek_update(skip_controlled, target_skip):
    gamma, e = 1e-3, 4
    cfg = bal.sign_rule(make_cfg(), gamma)
    cfg.update(skip_controlled=skip_controlled, target_skip=target_skip)
    counts = random_counts(np.random.default_rng(0), 60, 3, e + 1)
    bias0 = np.zeros((3, e + 1), np.float32)
    bias0[:, -1] = -1.0
    # independent DeepSeek-V3 rule: b ← b + γ·sign(t − f)
    ref = bias0.astype(np.float64)
    target = np.array([(1.0 - target_skip) / e] * e + [target_skip])
    state = bal.init_balancing(jnp.asarray(bias0))
    update = jax.jit(lambda s, c: bal.update_biases(s, c, cfg))
    for c in counts:
        step = gamma * np.sign(target - c / c.sum(-1, keepdims=True))
        if not skip_controlled:
            step[:, -1] = 0.0
        ref = ref + step
        bias, state, _ = update(state, jnp.asarray(c, jnp.int32))
        np.testing.assert_allclose(bias, ref, atol=1e-6, rtol=0)
    assert np.any(ref[:, -1] != bias0[:, -1]) == skip_controlled


def test_adaptive_pi_against_reference():
    """The default law (relative error, per-slot adaptive gain, clipped + recentred integral, logit units)."""
    kp, ki, ki_min, ki_max, up, down, clip, t_skip = 0.004, 0.002, 5e-4, 0.02, 1.5, 0.5, 0.05, 0.117  # t·N not integral
    cfg = make_cfg(
        kp=kp,
        ki=ki,
        ki_min=ki_min,
        ki_max=ki_max,
        gain_up=up,
        gain_down=down,
        integral_clip=clip,
        target_skip=t_skip,
        skip_controlled=True,
    )
    rng = np.random.default_rng(1)
    counts = random_counts(rng, 40, 2, C)
    counts[:20, 1, 3] += 200  # a persistently overloaded expert: its gain must grow to the cap
    bias0 = rng.normal(size=(2, C)).astype(np.float32)
    t = np.array([(1 - t_skip) / E] * E + [t_skip])
    u, g_min, g_max = 1.0 / C, ki_min / ki, ki_max / ki
    s_int, gain, prev_sign = np.zeros((2, C)), np.ones((2, C)), np.zeros((2, C))
    state = bal.init_balancing(jnp.asarray(bias0))
    update = jax.jit(lambda s, c: bal.update_biases(s, c, cfg))
    gains = []
    for c in counts:
        r = (t - c / c.sum(-1, keepdims=True)) / t
        gain = np.clip(gain * np.where(r * prev_sign > 0, up, np.where(r * prev_sign < 0, down, 1.0)), g_min, g_max)
        prev_sign = np.where(r < 0, -1.0, 1.0)
        s_max = np.full((2, C), clip / (u * ki))
        s_max[:, -1] += np.abs(bias0[:, -1]) / (u * ki)  # the skip slot may also undo its start offset
        s_int = np.clip(s_int + gain * r, -s_max, s_max)
        s_int[:, :E] -= s_int[:, :E].mean(-1, keepdims=True)
        delta = u * (kp * gain * r + ki * s_int)
        delta[:, :E] -= delta[:, :E].mean(-1, keepdims=True)
        bias, state, _ = update(state, jnp.asarray(c))
        np.testing.assert_allclose(bias, bias0 + delta, rtol=1e-5, atol=1e-6)
        gains.append(gain.copy())
    np.testing.assert_allclose(state.integral, s_int, rtol=1e-5, atol=1e-5)
    assert gains[19][1, 3] == g_max and gains[-1].min() == g_min  # reached the cap; the floor holds


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


@pytest.mark.parametrize(
    "field, value",
    [
        ("gain_units", "logits"),
        ("error_shape", "cube"),
        ("integral_clip", -1.0),
        ("target_skip", 1.0),
        ("ki_max", 1e-3),
        ("ki_min", 0.0),
        ("gain_down", 0.0),
        ("kp", -1.0),
    ],
)
def test_bad_config_is_one_clear_error(field, value):
    with pytest.raises(ConfigError, match=f"balancing.{field}"):
        validate_balancing(make_cfg(**{field: value}))


# ----------------------------------------------------------------------------- closed loop, synthetic router

# Fixed per-layer preferences (+ per-token N(0, 1) noise on the logits, times `scale`): layer 0 favours
# experts 0 and 1, layer 1 favours expert 5 strongly and expert 3 mildly. Skip logit 0, skip bias -1.
PREF = np.zeros((L, C), np.float32)
PREF[0, :2], PREF[1, 5], PREF[1, 3] = 2.0, 2.5, 1.0
BIAS0 = np.zeros((L, C), np.float32)
BIAS0[:, -1] = -1.0


def simulate(cfg, steps: int, pref=PREF, bias0=BIAS0, scale: float = 1.0, idle=None, seed: int = 0):
    """Closed loop: choice = argmax(softmax(scale·(pref + noise)) + β) (ties → lowest index) → counts →
    controller. idle=(layer, expert, until): that expert cannot be chosen before step `until`.

    Returns per-step (load_cv [steps, L], skip_fraction [steps, L], β after the step [steps, L, C]);
    the metrics of step k describe the choices made with the biases of step k − 1.
    """
    blocked = np.zeros((L, C), bool)
    if idle:
        blocked[idle[0], idle[1]] = True
    until = idle[2] if idle else 0

    def body(carry, xs):
        bias, state = carry
        key, k = xs
        probs = jax.nn.softmax(scale * (pref[:, None, :] + jax.random.normal(key, (L, T, C))), axis=-1)
        score = jnp.where(blocked[:, None, :] & (k < until), -jnp.inf, probs + bias[:, None, :])
        counts = jax.vmap(lambda c: jnp.bincount(c, length=C))(jnp.argmax(score, axis=-1))
        bias, state, m = bal.update_biases(state, counts, cfg)
        return (bias, state), (m["load_cv"], m["skip_fraction"], bias)

    b0 = jnp.asarray(bias0)
    run = jax.jit(lambda keys: jax.lax.scan(body, (b0, bal.init_balancing(b0)), (keys, jnp.arange(steps)))[1])
    return jax.tree.map(np.asarray, run(jax.random.split(jax.random.key(seed), steps)))


def first_below(cv: np.ndarray, level: float) -> list[int]:
    """Per layer, the first step whose load CV is below `level` (steps if never)."""
    return [int(np.argmax(col < level)) if (col < level).any() else len(col) for col in cv.T]


@pytest.mark.parametrize(
    "name, cfg, bound",
    [
        ("default", make_cfg(), 100),
        ("DeepSeek sign rule, γ = 1e-3", bal.sign_rule(make_cfg(), 1e-3), 500),
    ],
)
def test_controller_balances_skewed_router(name, cfg, bound):
    cv, skip, _ = simulate(cfg, bound + 150)
    assert cv[0].min() > 1.0  # strongly unbalanced at the start
    assert max(first_below(cv, 0.2)) <= bound, first_below(cv, 0.2)
    assert cv[-100:].mean() < 0.15 and cv[-100:].max() < 0.3  # and it stays balanced (T = 512: noise CV ≈ 0.12)
    assert skip.max() == 0.0  # t_skip = 0: the skip slot is never reached


def test_long_run_no_drift_no_windup():
    """2000 steps; layer 0's expert 2 cannot be chosen for the first 1500 (e.g. a dead expert).

    Mean expert bias: fixed at its start value every step (the sign rule drifts). Windup: the idle expert's
    bias stays within the clip, and once it is back the layer rebalances within 60 steps; without the clip
    its bias has wound up far beyond any router probability and the expert floods the layer for longer.
    """
    idle, back = (0, 2, 1500), 1500
    cv, _, bias = simulate(make_cfg(), 2000, idle=idle)
    np.testing.assert_allclose(bias[:, :, :E].mean(-1), 0.0, atol=1e-5)
    assert np.abs(bias[:back, 0, 2]).max() <= make_cfg().integral_clip + 0.05
    recover = first_below(cv[back:], 0.2)[0]
    assert recover <= 60
    assert cv[-300:].mean() < 0.15 and cv[-300:].max() < 0.3
    # the same run without anti-windup: the idle expert's bias grew without bound and it takes the layer
    cv_nc, _, bias_nc = simulate(make_cfg(integral_clip=0.0), 2000, idle=idle)
    assert bias_nc[back - 1, 0, 2] > 3.0
    assert first_below(cv_nc[back:], 0.2)[0] > 3 * recover
    # the DeepSeek sign rule: every bias moves up or down by γ; their mean wanders away from 0
    _, _, bias_sign = simulate(bal.sign_rule(make_cfg(), 1e-3), 2000, idle=idle)
    assert np.abs(bias_sign[:, :, :E].mean(-1)).max() > 0.1


def test_fresh_router_is_balanced_from_the_start():
    """At initialisation a router's probabilities differ by ~1e-4 (scale 0.001 here): a bias step at the gain of
    K_i (the floor before `ki_min`, 2e-4 × error) moves every token at once, so the loads flip between
    experts for good (the README demo's first 100 steps, the tiny example's whole run). With the floor at
    `ki_min`, the flips halve the gains until the steps resolve the router's margins, within ~15 steps."""
    cv, _, _ = simulate(make_cfg(), 400, scale=0.001)
    assert max(first_below(cv, 0.3)) <= 20 and cv[-200:].mean() < 0.15
    cv_old, _, _ = simulate(make_cfg(ki_min=make_cfg().ki), 400, scale=0.001)  # no slow-down below K_i
    assert cv_old[-200:].mean() > 2.0  # every step's tokens on one or two experts


def test_near_uniform_router_does_not_flip_flop():
    """A router at initialisation is nearly uniform: a bias step of 1e-3 moves every token. The per-slot
    gains shrink where the error flips sign, so loads settle; a fixed gain at the cap flips all tokens
    from expert to expert instead."""
    cfg = make_cfg()
    cv, _, _ = simulate(cfg, 400, scale=0.02)
    assert cv[-200:].mean() < 0.15
    fixed = make_cfg(ki=cfg.ki_max, ki_min=cfg.ki_max)  # K_i = ki_min = ki_max: no room to adapt
    cv_fixed, _, _ = simulate(fixed, 400, scale=0.02)
    assert cv_fixed[-200:].mean() > 1.0


def test_skip_slot_frozen_when_not_controlled():
    pref = PREF.copy()
    pref[:, -1] = 3.0  # the router likes to skip; with t_skip = 0.3 the skip slot is under target
    _, skip, bias = simulate(make_cfg(skip_controlled=False, target_skip=0.3), 200, pref=pref)
    np.testing.assert_array_equal(bias[:, :, -1], -1.0)  # frozen at its base value every step
    _, _, bias = simulate(make_cfg(skip_controlled=True, target_skip=0.3), 200, pref=pref)
    assert np.all(bias[-1, :, -1] > -1.0)  # controlled: raised toward its target


def test_skip_slot_controlled_toward_target():
    _, skip, bias = simulate(make_cfg(target_skip=0.1), 400)
    assert skip[:5].max() == 0.0  # starts unreachable (β_E = -1)
    np.testing.assert_allclose(skip[-100:].mean(0), 0.1, atol=0.02)
    assert np.all(bias[-1, :, -1] > -1.0)


# ----------------------------------------------------------------------------- warm start


def test_warm_start_removes_the_mean_expert_lead():
    """β⁰ − (p̄ − mean_e p̄) on the experts (NumPy), skip slot and empty layers unchanged, fresh state."""
    rng = np.random.default_rng(3)
    bias0 = rng.normal(0.0, 1e-3, (3, C)).astype(np.float32)
    bias0[:, -1] = -1.0
    probs = rng.dirichlet(np.ones(C), size=(3, 40))  # [L, tokens, C]
    prob_sum = probs.sum(1)
    prob_sum[2] = 0.0  # a layer without tokens
    state = bal.init_balancing(jnp.asarray(bias0))
    state = state._replace(integral=state.integral + 1.0, prev_error=state.prev_error - 0.5)
    bias, fresh = bal.warm_start(state, jnp.asarray(prob_sum, jnp.float32))
    mean_p = probs.mean(1)
    ref = bias0.astype(np.float64).copy()
    ref[:2, :E] -= mean_p[:2, :E] - mean_p[:2, :E].mean(-1, keepdims=True)
    np.testing.assert_allclose(bias, ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(fresh.base, bias)
    assert not np.any(fresh.integral) and not np.any(fresh.prev_error)


def test_warm_start_balances_a_fresh_router_at_once():
    """A fresh router: probabilities uniform to ~1e-4, the experts with fixed leads 0, 1.4e-5, …, 1e-4 (shuffled)
    and a token-to-token spread of 1e-5. Under β⁰ the top expert takes most tokens; after the warm start the next
    step's load CV is at the sampling-noise level, where the controller's own first update leaves it collapsed."""
    rng = np.random.default_rng(0)
    lead = np.zeros((L, C), np.float32)
    for layer in range(L):
        lead[layer, :E] = rng.permutation(np.linspace(0.0, 1e-4, E))

    def counts_for(bias, key):
        probs = 1.0 / C + lead[:, None, :] + 1e-5 * jax.random.normal(key, (L, T, C))
        choice = jnp.argmax(probs + bias[:, None, :], axis=-1)
        return jax.vmap(lambda c: jnp.bincount(c, length=C))(choice), probs.sum(1)

    cfg = make_cfg()
    state = bal.init_balancing(jnp.asarray(BIAS0))
    k0, k1 = jax.random.split(jax.random.key(0))
    counts0, prob_sum0 = counts_for(state.base, k0)
    cv0 = bal.load_metrics(counts0)["load_cv"]
    assert np.all(cv0 > 1.5), cv0  # collapsed onto one or two experts of 8 (all on one: CV √7 ≈ 2.65)
    warm_bias, _ = bal.warm_start(state, prob_sum0)
    pi_bias, _, _ = bal.update_biases(state, counts0, cfg)
    cv_warm = bal.load_metrics(counts_for(warm_bias, k1)[0])["load_cv"]
    cv_pi = bal.load_metrics(counts_for(pi_bias, k1)[0])["load_cv"]
    assert np.all(cv_warm < 0.3), cv_warm  # T = 512, 8 experts: sampling noise alone gives CV ≈ 0.12
    assert np.all(cv_pi > 1.0), cv_pi


def test_router_spread_against_numpy():
    """sqrt(mean over experts of the variance across tokens of p_e), from the step's sums; exact for a router that
    is uniform to 1e-5 (the sums are centred on 1/(E+1), so fp32 keeps the spread)."""
    rng = np.random.default_rng(5)
    for scale in (1e-5, 0.3):
        logits = scale * rng.normal(size=(L, 4096, C)) / (1.0 / C if scale < 1e-3 else 1.0)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        p32 = probs.astype(np.float32)
        spread = bal.router_spread(jnp.asarray(p32.sum(1)), jnp.asarray(np.square(p32 - 1.0 / C).sum(1)))
        ref = np.sqrt(probs[..., :E].var(axis=1).mean(-1))
        np.testing.assert_allclose(spread, ref, rtol=1e-3)
    assert np.all(bal.router_spread(jnp.zeros((L, C)), jnp.zeros((L, C))) == 0.0)  # a layer without tokens
