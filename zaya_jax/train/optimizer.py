"""Hybrid Muon + AdamW optimizer for ZAYA1 (arXiv 2511.17127 trains with Muon and AdamW).

`make_optimizer(config, params)` = global-norm clipping (`optimizer.grad_clip_norm`, 0 = off) →
`optax.partition` into

* ``"muon"``: 2-D hidden matrices — q/k/v/o projections (`wq`, `wk`, `wv_cur`, `wv_del`, `wo`),
  router projections (`w_down`, `w1`, `w2`, `w3`), expert kernels (`w_in`, `w_out`), and the
  per-head conv2 taps `conv2_w` when `optimizer.muon_conv`. Nesterov momentum → Newton–Schulz
  orthogonalisation **per matrix** → shape scaling → decoupled weight decay → −LR(step).
* ``"adam"``: everything else — the embedding / tied head, RMSNorm scales, biases, merge
  scales/biases, conv kernels (conv1 always, conv2 unless `muon_conv`), key temperatures, EDA
  scales. `optax.scale_by_adam` → decoupled weight decay (masked) → −LR(step).

Per-matrix orthogonalisation. Every kernel is `[..., in, out]` (y = x·W): the last two axes are
the matrix, every leading axis (layer [L], expert [E], conv tap / head) is a batch axis. NS runs
on each matrix independently through nested `jax.vmap`s, one per leading axis. With
`optimizer.muon_split_gate_up` the fused expert kernel `w_in [..., H, 2I]` is viewed as
`[..., 2, H, I]` (the gate | up split is one more batch axis), so gate and up are orthogonalised
as separate `[H, I]` matrices. The momentum keeps the parameter's own shape; the split is a view
inside the update.

Why not `optax.contrib.muon`: it would need `MuonDimensionNumbers(reduction_axis=-2,
output_axis=-1)` per leaf (its default also sends the embedding to Muon), but it cannot split the
fused gate/up axis, and it flattens all batch axes into one (a transpose + reshape), which breaks a
sharding of a minor batch axis (e.g. experts) into cross-device data movement. The transform below
keeps the optax momentum convention (`optax.tree.update_moment` / `bias_correction`, Nesterov as in
`optax.contrib.scale_by_muon`), the standard quintic NS coefficients (3.4445, −4.7750, 2.0315) with
Frobenius pre-normalisation, and optax's shape scaling (`muon_consistent_rms` > 0: update RMS ≈
consistent_rms, so Muon and AdamW LRs are comparable (Moonshot); 0: `sqrt(max(1, out/in))`).

Weight decay (decoupled, multiplied by the group's current LR): all Muon matrices and the conv
kernels; the embedding only when `optimizer.decay_embedding`; never norms, biases, merge
scales/biases, temperatures or EDA scales. `tx.update` must receive `params` when weight_decay > 0.

Precision: Newton–Schulz keeps its iterate in fp32 and runs its matmuls with operands in `ns_dtype` (the
model's compute dtype) and fp32 accumulation, like every other matmul of a step.

This module is the per-parameter optimizer (an optax transformation over the parameter tree): the
`fsdp` / `replicated` steps use it directly, checkpoints store its state layout, and it is the reference
the ZeRO-1 step's distributed optimizer (`zaya_jax.train.zero1.update`, where each device updates only the
matrices and elements it owns) is tested against.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from zaya_jax.keys import map_named
from zaya_jax.train import schedule as schedule_lib

NS_SCOPE = "newton_schulz"
NS_COEFFS = (3.4445, -4.7750, 2.0315)  # quintic Newton–Schulz (a, b, c): X ← aX + (bA + cA²)X, A = XXᵀ
MUON_MATRICES = frozenset({"wq", "wk", "wv_cur", "wv_del", "wo", "w_down", "w1", "w2", "w3", "w_in", "w_out"})
CONV_TAPS = "conv2_w"  # per-head [d, d] taps: Muon only with optimizer.muon_conv
SPLIT_LEAF = "w_in"  # fused [..., H, 2I] gate | up
ADAM_LEAVES = frozenset(
    {
        "embed",
        "in_scale",
        "in_bias",
        "scale",
        "conv1_w",
        "conv1_b",
        "conv2_b",
        "temp",
        "h_scale",
        "h_bias",
        "r_scale",
        "r_bias",
        "b_down",
        "eda_scale",
        "norm",
        "b1",
        "b2",
    }
)
DECAYED_ADAM_LEAVES = frozenset({"conv1_w", "conv2_w"})  # + "embed" with optimizer.decay_embedding
Pytree = Any


# ----------------------------------------------------------------------------- labels


def _label(name: str, muon_conv: bool) -> str:
    if name in MUON_MATRICES or (name == CONV_TAPS and muon_conv):
        return "muon"
    if name in ADAM_LEAVES or name == CONV_TAPS:
        return "adam"
    raise ValueError(
        f"optimizer: parameter {name!r} has no Muon/AdamW assignment; add it to MUON_MATRICES or "
        "ADAM_LEAVES in zaya_jax/train/optimizer.py"
    )


def param_labels(params: Pytree, *, muon_conv: bool = False) -> Pytree:
    """Same-structure tree of "muon" | "adam" for any param pytree (pure dict, `nnx.State`, with or
    without `nnx.Variable` nodes) whose key paths end in the ZAYA1 parameter names."""
    return map_named(lambda n, _: _label(n, muon_conv), params)


def decay_mask(params: Pytree, *, decay_embedding: bool = False, muon_conv: bool = False) -> Pytree:
    """Same-structure tree of bools: True = decoupled weight decay applies (Muon matrices, conv
    kernels, and the embedding iff `decay_embedding`)."""

    def f(name: str, _) -> bool:
        return _label(name, muon_conv) == "muon" or name in DECAYED_ADAM_LEAVES or (name == "embed" and decay_embedding)

    return map_named(f, params)


# ----------------------------------------------------------------------------- Newton–Schulz


def _ns_matrix(x: jax.Array, coeffs: tuple[float, float, float], steps: int, eps: float, dtype) -> jax.Array:
    """Quintic NS on one [m, n] matrix, run on the wide orientation (m ≤ n): fp32 iterate, `dtype` operands."""
    a, b, c = coeffs
    mm = lambda u, v: jnp.matmul(u.astype(dtype), v.astype(dtype), preferred_element_type=jnp.float32)  # noqa
    wide = x.shape[0] <= x.shape[1]
    x = x if wide else x.T
    x = x / (jnp.linalg.norm(x) + eps)
    for _ in range(steps):
        s = mm(x, x.T)
        x = a * x + mm(b * s + c * mm(s, s), x)
    return x if wide else x.T


def orthogonalize(
    x: jax.Array,
    *,
    ns_steps: int = 5,
    ns_coeffs: tuple[float, float, float] = NS_COEFFS,
    split_last: bool = False,
    eps: float = 1e-7,
    dtype=jnp.float32,
) -> jax.Array:
    """Approximate orthogonalisation U·Vᵀ of every matrix of x [..., in, out] (fp32 result).

    Leading axes are batch axes (one nested vmap each, so a sharded layer/expert axis stays local).
    split_last: treat [..., in, 2k] as two [in, k] matrices (gate | up) orthogonalised separately.
    dtype: operand dtype of the NS matmuls (fp32 accumulation).
    """
    x = x.astype(jnp.float32)
    if split_last:
        *lead, n_in, n_out = x.shape
        if n_out % 2:
            raise ValueError(f"split_last needs an even last axis, got shape {x.shape}")
        y = orthogonalize(
            jnp.moveaxis(x.reshape(*lead, n_in, 2, n_out // 2), -2, -3),
            ns_steps=ns_steps,
            ns_coeffs=ns_coeffs,
            eps=eps,
            dtype=dtype,
        )
        return jnp.moveaxis(y, -3, -2).reshape(x.shape)
    if x.ndim < 2:
        raise ValueError(f"Muon needs a matrix (rank >= 2), got shape {x.shape}")
    fn = lambda m: _ns_matrix(m, ns_coeffs, ns_steps, eps, dtype)  # noqa: E731
    for _ in range(x.ndim - 2):
        fn = jax.vmap(fn)
    with jax.named_scope(NS_SCOPE):  # op_name metadata: lets HLO checks find the iterations
        return fn(x)


def _matrix_dims(x: jax.Array, split: bool) -> tuple[int, int]:
    return x.shape[-2], (x.shape[-1] // 2 if split else x.shape[-1])


def shape_scale(fan_in: int, fan_out: int, consistent_rms: float) -> float:
    """Muon's update scale for an [fan_in, fan_out] matrix (see the module docstring)."""
    if consistent_rms > 0:
        return math.sqrt(max(fan_in, fan_out)) * consistent_rms
    return math.sqrt(max(1.0, fan_out / fan_in))


class MuonState(NamedTuple):
    count: jax.Array  # [] int32
    mu: Pytree  # momentum, same shapes (and shardings) as the params


def scale_by_muon_stacked(
    *,
    beta: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    ns_coeffs: tuple[float, float, float] = NS_COEFFS,
    split_gate_up: bool = True,
    consistent_rms: float = 0.2,
    eps: float = 1e-7,
    ns_dtype=jnp.float32,
) -> optax.GradientTransformation:
    """Muon direction for stacked kernels [..., in, out]: momentum → per-matrix NS → shape scale.

    Momentum follows `optax.contrib.scale_by_muon` (EMA with bias correction, optional Nesterov).
    Leaves named `w_in` are split into gate | up halves when `split_gate_up`. Works inside
    `optax.partition` (masked-out leaves are `optax.MaskedNode`s, which have no array leaves).
    """

    def init_fn(params):
        return MuonState(jnp.zeros([], jnp.int32), optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        if nesterov:
            mu_hat = jax.tree.map(
                lambda m, g: beta * m + (1 - beta) * g,
                optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                optax.tree.bias_correction(updates, beta, count),
            )
        else:
            mu_hat = optax.tree.bias_correction(mu, beta, count)

        def direction(name: str, m: jax.Array) -> jax.Array:
            split = split_gate_up and name == SPLIT_LEAF
            o = orthogonalize(m, ns_steps=ns_steps, ns_coeffs=ns_coeffs, split_last=split, eps=eps, dtype=ns_dtype)
            return (o * shape_scale(*_matrix_dims(m, split), consistent_rms)).astype(m.dtype)

        return map_named(direction, mu_hat), MuonState(count, mu)

    return optax.GradientTransformation(init_fn, update_fn)


# ----------------------------------------------------------------------------- clipping


def squared_norm(tree: Pytree) -> jax.Array:
    """Σ g² over all leaves of `tree`, fp32, as one dot per leaf: XLA:CPU reduces `sum(g * g)` from a
    materialised `g²` whenever `g` is itself a fused expression (e.g. the gradients times 1/tokens)."""
    return jnp.asarray(
        sum(jnp.vdot(g, g, preferred_element_type=jnp.float32) for g in jax.tree.leaves(tree)), jnp.float32
    )


def global_norm(tree: Pytree, scale: jax.Array | float = 1.0) -> jax.Array:
    """‖scale · tree‖₂, fp32, computed from the unscaled leaves (`squared_norm`)."""
    return jnp.sqrt(squared_norm(tree)) * jnp.abs(jnp.asarray(scale, jnp.float32))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """Global-norm clipping (as `optax.clip_by_global_norm`, same empty state) that takes the norm from the caller.

    `update(updates, state, params, grad_norm=n)` uses n = ‖updates‖ when given (the train step computes it once
    for its metrics, see `global_norm`), else computes it. The updates are multiplied by one scalar,
    min(1, max_norm / n), which XLA fuses into the optimizer's passes."""

    def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
        del params, extra_args
        norm = global_norm(updates) if grad_norm is None else grad_norm
        factor = jnp.where(norm < max_norm, 1.0, max_norm / norm)
        return jax.tree.map(lambda g: (g * factor).astype(g.dtype), updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


# ----------------------------------------------------------------------------- the optimizer


def make_optimizer(config: ml_collections.ConfigDict, params: Pytree | None = None) -> optax.GradientTransformation:
    """clip → partition{muon, adam} with separate scheduled peak LRs (`schedule.learning_rate_schedules`).

    params (optional): checked eagerly, so an unassigned parameter name fails here, not inside jit.
    Labels and masks are callables on the tree passed to init/update, so the same transformation
    works on pure dicts and on `nnx.State`s (as `nnx.Optimizer(model, tx, wrt=nnx.Param)` uses).
    """
    o = config.optimizer
    muon_conv = bool(o.muon_conv)
    if params is not None:
        param_labels(params, muon_conv=muon_conv)
    lrs = schedule_lib.learning_rate_schedules(config)
    wd = float(o.weight_decay)

    def decay(tx_list: list, mask):
        return tx_list + [optax.add_decayed_weights(wd, mask)] if wd > 0 else tx_list

    muon_tx = optax.chain(
        *decay(
            [
                scale_by_muon_stacked(
                    beta=o.muon_momentum,
                    nesterov=bool(o.muon_nesterov),
                    ns_steps=int(o.muon_ns_steps),
                    split_gate_up=bool(o.muon_split_gate_up),
                    consistent_rms=float(o.muon_consistent_rms),
                    ns_dtype=jnp.dtype(config.model.dtype),
                )
            ],
            None,
        ),
        optax.scale_by_learning_rate(lrs["muon"]),
    )
    adam_mask = lambda p: decay_mask(
        p,
        decay_embedding=bool(o.decay_embedding),  # noqa: E731
        muon_conv=muon_conv,
    )
    adam_tx = optax.chain(
        *decay([optax.scale_by_adam(b1=o.adam_b1, b2=o.adam_b2, eps=o.adam_eps)], adam_mask),
        optax.scale_by_learning_rate(lrs["adam"]),
    )
    split = optax.partition({"muon": muon_tx, "adam": adam_tx}, lambda p: param_labels(p, muon_conv=muon_conv))
    if o.grad_clip_norm and o.grad_clip_norm > 0:
        return optax.chain(clip_by_global_norm(float(o.grad_clip_norm)), split)
    return split
