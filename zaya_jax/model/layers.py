"""Small shared pieces: dtypes, initialisers, RMSNorm (§4), partial RoPE (§5g) and residual scaling (§3).

Section numbers (§) refer to docs/architecture.md. Matmuls, expert GEMMs and attention are kernels
(`zaya_jax.kernels`), chosen per platform; nothing here depends on the platform.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class BalancingBias(nnx.Variable):
    """Router balancing biases β (§6): fp32 state that changes the expert choice only.

    Not an `nnx.Param`, so optimizers built with `wrt=nnx.Param` never see it; the balancing
    controller (`zaya_jax.train.balancing`) writes it after each optimizer step.
    """


def dtype_of(name: str) -> jnp.dtype:
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def param(value: jax.Array, axes: tuple[str, ...]) -> nnx.Param:
    """A parameter carrying its logical axis names (one per dim, e.g. ("experts", "embed", "mlp")).

    The names are metadata only (`nnx.get_partition_spec` reads them back); `zaya_jax.parallel.sharding`
    maps them to mesh axes with one rules table. No sharding is applied at creation (models are built
    outside any mesh too: tests, conversion, inference).
    """
    if len(axes) != value.ndim:
        raise ValueError(f"logical axes {axes} do not match a parameter of shape {value.shape}")
    return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def normal_param(rngs: nnx.Rngs, shape: tuple[int, ...], std: float, dtype, axes: tuple[str, ...]) -> nnx.Param:
    return param(std * jax.random.normal(rngs.params(), shape, dtype=jnp.float32).astype(dtype), axes)


def const_param(shape: tuple[int, ...], value: float, dtype, axes: tuple[str, ...]) -> nnx.Param:
    return param(jnp.full(shape, value, dtype=dtype), axes)


def lead(w: jax.Array, ndim: int) -> jax.Array:
    """`w` [..., D] with size-1 leading axes added up to `ndim` dims: explicit broadcasting (tests run with
    jax_numpy_rank_promotion='raise'). E.g. a norm weight [H] → [1, 1, H] against [B, S, H]."""
    return w.reshape((1,) * (ndim - w.ndim) + w.shape)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, dtype) -> jax.Array:
    """`w ⊙ cast(x · rsqrt(mean(x²) + eps))` with fp32 statistics (§4). x: [..., D] → [..., D] in `dtype`."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return rounded_product(lead(weight, normed.ndim), normed, dtype)


def rounded_product(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """`cast(a, dtype) ⊙ cast(b, dtype)` in `dtype`, formed in fp32 and rounded once.

    The same values as multiplying in `dtype` (a product of two bf16 numbers is exact in fp32), but the
    gradient of a broadcast operand (a norm scale, a conv tap: a sum over every token) is reduced in fp32
    rather than in bf16, which is both more accurate and, on XLA:CPU, much faster."""
    rounded = lambda v: v.astype(dtype).astype(jnp.float32)  # noqa: E731
    return (rounded(a) * rounded(b)).astype(dtype)


class RMSNorm(nnx.Module):
    """RMSNorm with a learned scale, eps 1e-5 in ZAYA1 (§4)."""

    def __init__(self, dim: int, eps: float, *, param_dtype, dtype):
        self.scale = const_param((dim,), 1.0, param_dtype, ("embed",))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps, self.dtype)


class Merge(nnx.Module):
    """Residual scaling `(y + b_h) ⊙ s_h + (r + b_r) ⊙ s_r` (§3), formed in fp32.

    y: block output [..., H] (any dtype), r: residual [..., H] fp32 → new residual fp32.
    """

    def __init__(self, dim: int, *, param_dtype):
        self.h_scale = const_param((dim,), 1.0, param_dtype, ("embed",))
        self.h_bias = const_param((dim,), 0.0, param_dtype, ("embed",))
        self.r_scale = const_param((dim,), 1.0, param_dtype, ("embed",))
        self.r_bias = const_param((dim,), 0.0, param_dtype, ("embed",))

    def __call__(self, y: jax.Array, r: jax.Array) -> jax.Array:
        f32 = lambda v: lead(v[...].astype(jnp.float32), y.ndim)  # noqa: E731
        y = (y.astype(jnp.float32) + f32(self.h_bias)) * f32(self.h_scale)
        return y + (r.astype(jnp.float32) + f32(self.r_bias)) * f32(self.r_scale)


def rope_tables(positions: jax.Array, rotary_dims: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [..., S, rotary_dims/2] in fp32 for integer positions [..., S] (§5g)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dims, 2, dtype=jnp.float32) / rotary_dims))
    phase = positions.astype(jnp.float32)[..., None] * lead(inv_freq, positions.ndim + 1)
    return jnp.cos(phase), jnp.sin(phase)


def apply_partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on dims [0, r) of each head; dims [r, d) pass through (§5g).

    x: [B, S, N, d]; cos/sin: [B or 1, S, r/2] → [B, S, N, d] (same dtype as x).
    """
    half = cos.shape[-1]
    u1, u2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return jnp.concatenate([u1 * c - u2 * s, u2 * c + u1 * s, rest], axis=-1)
