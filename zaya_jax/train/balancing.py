"""Expert-balancing controller for the router biases β (ZAYA1, arXiv 2511.17127; docs/balancing.md).

ZAYA1 balances its experts without an auxiliary loss: a bias β_e added to the router probabilities
changes which expert a token picks (never its gate), and a controller moves β from the observed loads.
The paper calls the controller PID-like but does not publish it; this is the project's design.

Per MoE layer, outside autodiff, after each optimizer step, from the global choice counts c [L, E+1]
(slot E = skip, counted before any capacity drop, summed over micro-batches and data-like mesh axes):

    f_e = c_e / N                      N = Σ_e c_e (tokens per layer)
    t_e = (1 − t_skip) / E  (e < E),   t_E = t_skip
    ε   = t − f                        positive = under-loaded → raise β_e
    ε̃   = φ(ε) [/ t]                   φ ∈ {identity, sign, tanh(·/τ)}; optional division by t
    g   ← clip(g⁻·m, 1, K_i,max/K_i)   per slot; m = gain_up if ε̃ kept its sign, gain_down if it flipped, else 1
    S   ← clip(S + g·ε̃, ±S_max)        anti-windup: S_max = integral_clip / (u·K_i) (+ |β⁰_E|/(u·K_i) for skip)
    S_e ← S_e − mean_{e<E} S_e         (recenter) real experts only
    δ   = u·(K_p·g·ε̃ + K_i·S)
    δ_e ← δ_e − mean_{e<E} δ_e         (recenter) so the mean expert bias stays at its start value
    β   = β⁰ + δ

The per-slot gain g adapts like Rprop's step size: the loads' response to a bias move varies by orders of
magnitude between a near-uniform router (fresh init; near-tied experts) and a sharp one, so a slot whose
error keeps its sign speeds up and one whose error flips (the last move overshot) slows down.
u is the gain unit: `gain_units="logit"` sets u = 1/(E+1), the mean router probability (a bias δ on the
probabilities of a router near its mean shifts the choice like a logit offset of about δ/u, so gains
carry over between expert counts); "probability" sets u = 1 (raw β units). `integral_clip` is in β units.

Default (`zaya_jax.config.balancing_config`): PI on the relative error (identity, divided by t) with adaptive gains,
recentring, a clipped integral, the skip slot controlled toward t_skip when t_skip > 0 (else it keeps
β⁰_E, −1 at init: with the mean expert bias held at 0 the skip slot can never win). DeepSeek-V3's
auxiliary-loss-free rule β ← β + γ·sign(t − f) is the special case φ = sign, K_p = 0, K_i = K_i,max = γ,
u = 1, no clip, no recentring, skip frozen (`sign_rule`).

Warm start (`warm_start`, on by default): a freshly initialised router is uniform to ~1e-4, but not around
the same value for every expert — its GELU MLP gives each expert a fixed lead over all tokens that is larger than
the token-to-token variation, so under β⁰ every token of a layer picks the same expert and the controller
spends tens of steps undoing a lead it could have measured. At step 0 the controller therefore measures it:

    p̄_e = Σ_tokens p_e / N             mean router probability (global batch, all micro-batches)
    β⁰_e ← β⁰_e − (p̄_e − mean_{e<E} p̄_e)   real experts only; the skip slot keeps β⁰_E

and starts from there with a fresh state (the step-0 counts were measured under the old β⁰, so they do not
drive an update). With the lead gone, a token's choice follows the router's variation across tokens.

Choices: with `normalize_by_target` a zero target (t_skip = 0) is replaced by the expert target; a layer
with N = 0 contributes zero error. All replicas compute the same update from the same global counts, so β
stays replicated. `cfg` (a `config.balancing` ConfigDict) is read as Python values at trace time: close
over it when jitting.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.config import ERROR_SHAPES, GAIN_UNITS, choice_table
from zaya_jax.model.layers import lead


class BalancingState(NamedTuple):
    """Controller state, fp32, all [L, E+1]; checkpoint it with the model's β."""

    base: jax.Array  # β⁰: the biases at controller start (the skip slot stays here when not controlled)
    integral: jax.Array  # S
    prev_error: jax.Array  # sign(ε̃⁻)·g: the previous error's sign times the slot's current gain (0 at start)


def init_balancing(bias0: jax.Array) -> BalancingState:
    """State for biases `bias0` [L, E+1] (e.g. the model's `balancing_bias` at step 0)."""
    b = jnp.asarray(bias0, jnp.float32)
    return BalancingState(b, jnp.zeros_like(b), jnp.zeros_like(b))


def sign_rule(cfg: ml_collections.ConfigDict, gamma: float = 1e-3) -> ml_collections.ConfigDict:
    """`cfg` (a `config.balancing`) set to DeepSeek-V3's rule β ← β + γ·sign(t − f), skip slot frozen."""
    cfg.update(
        dict(
            error_shape="sign",
            normalize_by_target=False,
            kp=0.0,
            ki=gamma,
            ki_min=gamma,
            ki_max=gamma,
            gain_units="probability",
            integral_clip=0.0,
            recenter=False,
            skip_controlled=False,
        )
    )
    return cfg


def targets(num_classes: int, target_skip: float) -> jax.Array:
    """t [E+1]: (1 − t_skip)/E for the E experts, t_skip for the skip slot."""
    e = num_classes - 1
    return jnp.concatenate(
        [jnp.full((e,), (1.0 - target_skip) / e, jnp.float32), jnp.full((1,), target_skip, jnp.float32)]
    )


def loads(counts: jax.Array) -> jax.Array:
    """f [L, E+1] = c / N per layer (0 for a layer without tokens)."""
    c = counts.astype(jnp.float32)
    n = c.sum(axis=-1, keepdims=True)
    return jnp.where(n > 0, c / jnp.maximum(n, 1.0), 0.0)


_ERROR_SHAPES = choice_table(
    ERROR_SHAPES,
    {  # φ(ε, cfg)
        "identity": lambda e, cfg: e,
        "sign": lambda e, cfg: jnp.sign(e),
        "tanh": lambda e, cfg: jnp.tanh(e / cfg.tanh_tau),
    },
)
_GAIN_UNITS = choice_table(
    GAIN_UNITS, {"logit": lambda num_classes: 1.0 / num_classes, "probability": lambda num_classes: 1.0}
)


def shape_error(err: jax.Array, cfg: ml_collections.ConfigDict, t: jax.Array) -> jax.Array:
    """φ(ε), optionally divided by the target (zero targets use the expert target)."""
    out = _ERROR_SHAPES[cfg.error_shape](err, cfg)
    if cfg.normalize_by_target:
        out = out / lead(jnp.where(t > 0, t, t[0]), out.ndim)
    return out


def gain_unit(cfg: ml_collections.ConfigDict, num_classes: int) -> float:
    """u: 1/(E+1) for `gain_units="logit"` (the mean router probability), 1 for "probability"."""
    return _GAIN_UNITS[cfg.gain_units](num_classes)


def router_spread(prob_sum: jax.Array, prob_dev_sq_sum: jax.Array) -> jax.Array:
    """[L] how far a layer's router probabilities differ between tokens: sqrt(mean_{e<E} Var_tokens(p_e)).

    prob_sum, prob_dev_sq_sum: [L, E+1] Σ p and Σ (p − 1/(E+1))² over the step's tokens (`MoEStats`). A bias step
    of about this size moves a sizeable share of a layer's tokens between experts: ~3e-5 for the demo's fresh router,
    ~1e-2 forty steps later. A metric (`router_spread`): how fine the biases must be to steer this layer. 0 for a
    layer without tokens.
    """
    n = prob_sum.sum(-1, keepdims=True)  # Σ_e p_e = 1 per token
    inv = jnp.where(n > 0, 1.0 / jnp.maximum(n, 1e-30), 0.0)
    dev = prob_sum * inv - 1.0 / prob_sum.shape[-1]
    var = jnp.maximum(prob_dev_sq_sum * inv - jnp.square(dev), 0.0)
    return jnp.sqrt(var[:, :-1].mean(-1))


def skip_controlled(cfg: ml_collections.ConfigDict) -> bool:
    """Whether β_E moves: `skip_controlled` and a positive skip target (target 0 keeps β⁰_E)."""
    return bool(cfg.skip_controlled) and cfg.target_skip > 0


def load_metrics(counts: jax.Array) -> dict[str, jax.Array]:
    """Per-layer load statistics from counts [L, E+1].

    load_cv [L]: std/mean (population std) of the expert loads among expert tokens (skip excluded);
    skip_fraction [L]: c_E / N; max_min_load_ratio [L]: max_e c_e / max(min_e c_e, 1) over real
    experts (an idle expert counts as 1 token, so the ratio stays finite); load [L, E+1]: f.
    """
    chex.assert_rank(counts, 2)
    c = counts.astype(jnp.float32)
    ce = c[:, :-1]
    ne = ce.sum(-1, keepdims=True)
    fe = jnp.where(ne > 0, ce / jnp.maximum(ne, 1.0), 0.0)
    mean = fe.mean(-1)
    cv = jnp.where(mean > 0, fe.std(-1) / jnp.maximum(mean, 1e-30), 0.0)
    n = c.sum(-1)
    return {
        "load_cv": cv,
        "skip_fraction": jnp.where(n > 0, c[:, -1] / jnp.maximum(n, 1.0), 0.0),
        "max_min_load_ratio": ce.max(-1) / jnp.maximum(ce.min(-1), 1.0),
        "load": loads(counts),
    }


def _recenter_experts(x: jax.Array) -> jax.Array:
    """x [L, E+1] with the mean over the real experts (slots < E) subtracted from those slots."""
    return x.at[:, :-1].add(-x[:, :-1].mean(-1, keepdims=True))


def gain_factor(state: BalancingState, shaped: jax.Array, cfg: ml_collections.ConfigDict) -> jax.Array:
    """[L, E+1] per-slot gain factor g ∈ [1, ki_max/K_i] and its memory (Rprop-style step adaptation).

    `state.prev_error` holds sign(ε̃⁻)·g⁻ (0 at start: g⁻ = 1, no sign). An error that keeps its sign multiplies
    the slot's gain by `gain_up` (the bias is too slow for this router), one that flips sign multiplies it by
    `gain_down` (the last move overshot: the router's margins at this slot are finer than the step).
    """
    g_prev = jnp.where(state.prev_error == 0, 1.0, jnp.abs(state.prev_error))
    agree = shaped * state.prev_error
    factor = jnp.where(agree > 0, cfg.gain_up, jnp.where(agree < 0, cfg.gain_down, 1.0))
    if cfg.ki <= 0:
        return jnp.ones_like(g_prev)
    return jnp.clip(g_prev * factor, min(cfg.ki_min, cfg.ki) / cfg.ki, cfg.ki_max / cfg.ki)


def update_biases(
    state: BalancingState, counts: jax.Array, cfg: ml_collections.ConfigDict
) -> tuple[jax.Array, BalancingState, dict[str, jax.Array]]:
    """One controller step. counts: [L, E+1] int global choice counts of this step.

    Returns (new β [L, E+1] fp32, new state, metrics). With `cfg.enabled=False` β = β⁰ and the state
    is unchanged (metrics are still computed). Metrics: `load_metrics(counts)` plus `bias` [L, E+1].
    """
    chex.assert_equal_shape([counts, state.base])
    metrics = load_metrics(counts)
    if not cfg.enabled:
        return state.base, state, {**metrics, "bias": state.base}
    c = counts.astype(jnp.float32)
    t = targets(c.shape[-1], float(cfg.target_skip))
    n = c.sum(-1, keepdims=True)
    # ε = t − c/N written as (t·N − c)/N: a balanced slot gives exactly 0 (sign 0) whenever t·N is exact;
    # XLA may turn c/N into c·(1/N), which is not exact.
    err = jnp.where(n > 0, (t[None, :] * n - c) / jnp.maximum(n, 1.0), 0.0)
    shaped = shape_error(err, cfg, t)
    if not skip_controlled(cfg):
        shaped = shaped.at[:, -1].set(0.0)
    g = gain_factor(state, shaped, cfg)
    integral = state.integral + g * shaped
    u = gain_unit(cfg, c.shape[-1])
    if cfg.integral_clip > 0 and cfg.ki > 0:
        # the skip slot's range also covers its start offset (β⁰_E = −1 keeps it out of play)
        reach = jnp.full_like(integral, cfg.integral_clip).at[:, -1].add(jnp.abs(state.base[:, -1]))
        s_max = reach / (u * cfg.ki)
        integral = jnp.clip(integral, -s_max, s_max)
    if cfg.recenter:
        integral = _recenter_experts(integral)
    delta = u * (cfg.kp * g * shaped + cfg.ki * integral)
    if cfg.recenter:
        delta = _recenter_experts(delta)
    if not skip_controlled(cfg):
        delta = delta.at[:, -1].set(0.0)
    bias = state.base + delta
    memory = g * jnp.where(shaped < 0, -1.0, 1.0)
    return bias, BalancingState(state.base, integral, memory), {**metrics, "bias": bias}


def warm_start(state: BalancingState, prob_sum: jax.Array) -> tuple[jax.Array, BalancingState]:
    """(β, fresh state) with the experts' mean router-probability lead removed from β⁰ (module docstring).

    prob_sum: [L, E+1] router probabilities summed over the step's tokens. A layer without tokens is unchanged.
    """
    chex.assert_equal_shape([prob_sum, state.base])
    p = prob_sum.astype(jnp.float32)
    n = p.sum(-1, keepdims=True)  # Σ_e p_e = 1 per token: the token count
    mean_p = jnp.where(n > 0, p / jnp.maximum(n, 1e-30), 0.0)
    bias = state.base - _recenter_experts(mean_p).at[:, -1].set(0.0)
    return bias, init_balancing(bias)


def dropped_fraction(dropped: jax.Array, counts: jax.Array) -> jax.Array:
    """[L] fraction of expert-routed tokens dropped by capacity: dropped [L] / Σ_{e<E} counts [L, E+1].

    Skip-slot tokens use no capacity, so they are not in the denominator.
    """
    routed = counts[:, :-1].astype(jnp.float32).sum(-1)
    return jnp.where(routed > 0, dropped.astype(jnp.float32) / jnp.maximum(routed, 1.0), 0.0)
