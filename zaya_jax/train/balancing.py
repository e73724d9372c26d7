"""PID controller for the router balancing biases β (docs/architecture.md §6, §13.1).

DESIGN PROPOSAL, not ZAYA1's (unpublished) rule. Per MoE layer, outside autodiff, after each
optimizer step, from the global choice counts c [L, E+1] (slot E = skip, counted before any
capacity drop, summed over microbatches and all data-like mesh axes):

    f_e = c_e / N                      N = Σ_e c_e (tokens per layer)
    t_e = (1 − t_skip) / E  (e < E),   t_E = t_skip
    ε   = t − f                        positive = under-loaded → raise β_e
    ε̃   = φ(ε) [/ t]                   φ ∈ {identity, sign, tanh(·/τ)}; optional division by t
    S   ← clip(S + ε̃, ±S_max)          S_max = integral_clip, 0 = no clip
    S_e ← S_e − mean_{e<E} S_e         optional (recenter), real experts only
    β   = β⁰ + K_p·ε̃ + K_i·S + K_d·(ε̃ − ε̃⁻)

`skip_controlled=False` freezes β_E = β⁰_E (its S and ε̃⁻ stay 0). DeepSeek-V3's
auxiliary-loss-free rule β ← β + γ·sign(t − f) is the special case φ = sign, K_p = K_d = 0,
K_i = γ, no clip, no recentring: β_T = β⁰ + γ·Σ_{k≤T} sign(ε_k).

Choices: with `normalize_by_target` a zero target (t_skip = 0) is replaced by the expert target
(1 − t_skip)/E; the first step's derivative term uses ε̃⁻ = 0; a layer with N = 0 (no tokens)
contributes zero error. All replicas compute the same update from the same global counts, so β
stays replicated. `cfg` (a `config.balancing` ConfigDict) is read as Python values at trace time:
close over it when jitting.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.config import ConfigError

ERROR_SHAPES = ("identity", "sign", "tanh")


class BalancingState(NamedTuple):
    """Controller state, fp32, all [L, E+1]; checkpoint it with the model's β."""

    base: jax.Array  # β⁰: the biases at controller start (skip slot stays here when frozen)
    integral: jax.Array  # S
    prev_error: jax.Array  # ε̃⁻, the previous shaped error


def init_balancing(bias0: jax.Array) -> BalancingState:
    """State for biases `bias0` [L, E+1] (e.g. the model's `balancing_bias` at step 0)."""
    b = jnp.asarray(bias0, jnp.float32)
    return BalancingState(b, jnp.zeros_like(b), jnp.zeros_like(b))


def targets(num_classes: int, target_skip: float) -> jax.Array:
    """t [E+1]: (1 − t_skip)/E for the E experts, t_skip for the skip slot."""
    e = num_classes - 1
    return jnp.concatenate([jnp.full((e,), (1.0 - target_skip) / e, jnp.float32),
                            jnp.full((1,), target_skip, jnp.float32)])


def loads(counts: jax.Array) -> jax.Array:
    """f [L, E+1] = c / N per layer (0 for a layer without tokens)."""
    c = counts.astype(jnp.float32)
    n = c.sum(axis=-1, keepdims=True)
    return jnp.where(n > 0, c / jnp.maximum(n, 1.0), 0.0)


def shape_error(err: jax.Array, cfg: ml_collections.ConfigDict, t: jax.Array) -> jax.Array:
    """φ(ε), optionally divided by the target (zero targets use the expert target)."""
    if cfg.error_shape == "identity":
        out = err
    elif cfg.error_shape == "sign":
        out = jnp.sign(err)
    elif cfg.error_shape == "tanh":
        if cfg.tanh_tau <= 0:
            raise ConfigError(f"balancing.tanh_tau={cfg.tanh_tau} must be > 0")
        out = jnp.tanh(err / cfg.tanh_tau)
    else:
        raise ConfigError(f"balancing.error_shape={cfg.error_shape!r}; choose one of {ERROR_SHAPES}")
    if cfg.normalize_by_target:
        out = out / jnp.where(t > 0, t, t[0])
    return out


def load_metrics(counts: jax.Array) -> dict[str, jax.Array]:
    """Per-layer load statistics from counts [L, E+1].

    load_cv [L]: std/mean (population std) of the expert loads among expert tokens (skip excluded);
    skip_fraction [L]: c_E / N; max_min_load_ratio [L]: max_e c_e / max(min_e c_e, 1) over real
    experts (an idle expert counts as 1 token, so the ratio stays finite); load [L, E+1]: f.
    """
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


def update_biases(state: BalancingState, counts: jax.Array, cfg: ml_collections.ConfigDict
                  ) -> tuple[jax.Array, BalancingState, dict[str, jax.Array]]:
    """One controller step (§13.1). counts: [L, E+1] int global choice counts of this step.

    Returns (new β [L, E+1] fp32, new state, metrics). With `cfg.enabled=False` β = β⁰ and the state
    is unchanged (metrics are still computed). Metrics: `load_metrics(counts)` plus `bias` [L, E+1].
    """
    metrics = load_metrics(counts)
    if not cfg.enabled:
        return state.base, state, {**metrics, "bias": state.base}
    c = counts.astype(jnp.float32)
    t = targets(c.shape[-1], float(cfg.target_skip))
    n = c.sum(-1, keepdims=True)
    # ε = t − c/N written as (t·N − c)/N: a balanced slot gives exactly 0 (sign 0) whenever t·N is exact;
    # XLA may turn c/N into c·(1/N), which is not exact.
    err = jnp.where(n > 0, (t * n - c) / jnp.maximum(n, 1.0), 0.0)
    shaped = shape_error(err, cfg, t)
    if not cfg.skip_controlled:
        shaped = shaped.at[:, -1].set(0.0)
    integral = state.integral + shaped
    if cfg.integral_clip > 0:
        integral = jnp.clip(integral, -cfg.integral_clip, cfg.integral_clip)
    if cfg.recenter:
        integral = integral.at[:, :-1].add(-integral[:, :-1].mean(-1, keepdims=True))
    bias = state.base + cfg.kp * shaped + cfg.ki * integral + cfg.kd * (shaped - state.prev_error)
    if not cfg.skip_controlled:
        bias = bias.at[:, -1].set(state.base[:, -1])
    new_state = BalancingState(state.base, integral, shaped)
    return bias, new_state, {**metrics, "bias": bias}


def dropped_fraction(dropped: jax.Array, counts: jax.Array) -> jax.Array:
    """[L] fraction of expert-routed tokens dropped by capacity: dropped [L] / Σ_{e<E} counts [L, E+1].

    Skip-slot tokens use no capacity, so they are not in the denominator.
    """
    routed = counts[:, :-1].astype(jnp.float32).sum(-1)
    return jnp.where(routed > 0, dropped.astype(jnp.float32) / jnp.maximum(routed, 1.0), 0.0)
