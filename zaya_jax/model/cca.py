"""Compressed Convolutional (Grouped-Query) Attention, CCA/CCGQA (§5; arXiv 2510.04476).

Shapes: B batch, S sequence, H hidden, n_q / n_kv query / key-value heads of width d,
G = n_q / n_kv, C = (n_q + n_kv)·d packed conv channels, k0 / k1 the two conv kernel sizes.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.kernels import Kernels
from zaya_jax.model import layers


def conv_halo_len(k0: int, k1: int) -> int:
    """Zeros padded once on the left of the packed q‖k input: (k0 − 1) + (k1 − 1) (= 2 for ZAYA1)."""
    return (k0 - 1) + (k1 - 1)


def causal_convs(
    c_padded: jax.Array, w1: jax.Array, b1: jax.Array, w2: jax.Array, b2: jax.Array, kernels: Kernels
) -> jax.Array:
    """The two *valid* convolutions of §5c on an already left-padded packed input.

    c_padded: [B, S + halo, C] (halo = zeros for a sequence start, or the previous raw q‖k vectors);
    w1: [k0, C] depthwise taps (tap 0 = oldest); b1: [C]; w2: [k1, G_c, d, d] grouped taps, G_c = C / d;
    b2: [C]; kernels: the grouped conv's einsum. Returns z: [B, S, C] fp32 (the grouped conv accumulates in
    fp32). Padding once (not per conv) keeps y_{-1} = b1, as the reference does.
    """
    k0, k1 = w1.shape[0], w2.shape[0]
    n_groups, d = w2.shape[1], w2.shape[2]
    dt = c_padded.dtype
    len_y = c_padded.shape[1] - k0 + 1
    # y = b1 + Σ_τ c[τ] ⊙ w1[τ]: [B, S + k1 - 1, C], each op rounded to the compute dtype as before, but the
    # products and the bias add in fp32, so the tap and bias gradients are fp32 sums over the tokens
    taps = sum(layers.rounded_product(c_padded[:, tau : tau + len_y], layers.lead(w1[tau], 3), dt) for tau in range(k0))
    y = (layers.lead(b1, 3).astype(jnp.float32) + taps.astype(jnp.float32)).astype(dt)
    seq = len_y - k1 + 1
    b = y.shape[0]
    y = y.reshape(b, -1, n_groups, d).transpose(2, 0, 1, 3)  # [G_c, B, S + k1 - 1, d]: groups lead (batch dim)
    z = sum(kernels.einsum("gbti,gio->gbto", y[:, :, tau : tau + seq], w2[tau], dt) for tau in range(k1))
    return z.transpose(1, 2, 0, 3).reshape(b, seq, n_groups * d) + layers.lead(b2.astype(jnp.float32), 3)


def l2_normalize(x: jax.Array, scale: float, eps: float) -> jax.Array:
    """`scale · x / max(‖x‖₂, eps)` over the last axis, in fp32 (§5f)."""
    x32 = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True))
    return x32 * (scale / jnp.maximum(norm, eps))


class CCA(nnx.Module):
    """One CCA attention sub-layer: latent q/k projections, mean path, two causal convs, value shift,
    L2 norm with learned key temperature, partial RoPE after the norm, GQA attention, output projection.
    `kernels`: the model's kernel choice (`Zaya` resolves it once and hands it down)."""

    def __init__(self, m: ml_collections.ConfigDict, kernels: Kernels, *, rngs: nnx.Rngs):
        pd, std = layers.dtype_of(m.param_dtype), m.initializer_range
        h, d, nq, nkv = m.hidden_size, m.head_dim, m.num_q_heads, m.num_kv_heads
        c = (nq + nkv) * d
        self.cfg = m
        self.kernels = kernels
        self.wq = layers.normal_param(rngs, (h, nq * d), std, pd, ("embed", "q_heads"))
        self.wk = layers.normal_param(rngs, (h, nkv * d), std, pd, ("embed", "kv_heads"))
        self.wv_cur = layers.normal_param(rngs, (h, nkv * d // 2), std, pd, ("embed", "kv_half"))
        self.wv_del = layers.normal_param(rngs, (h, nkv * d // 2), std, pd, ("embed", "kv_half"))
        self.conv1_w = layers.normal_param(rngs, (m.cca_time0, c), std, pd, ("conv_taps", "qk"))
        self.conv1_b = layers.const_param((c,), 0.0, pd, ("qk",))
        self.conv2_w = layers.normal_param(
            rngs, (m.cca_time1, nq + nkv, d, d), std, pd, ("conv_taps", "qk_groups", "head_in", "head_out")
        )
        self.conv2_b = layers.const_param((c,), 0.0, pd, ("qk",))
        self.temp = layers.const_param((nkv,), m.temp_init, pd, ("kv_groups",))
        self.wo = layers.normal_param(rngs, (nq * d, h), std, pd, ("q_heads", "embed"))

    def packed_qk(self, x: jax.Array) -> jax.Array:
        """Raw packed latent q‖k (§5a, c): x [B, S, H] → c [B, S, C] in the compute dtype (the conv input)."""
        dt = layers.dtype_of(self.cfg.dtype)
        mm = self.kernels.linear
        return jnp.concatenate([mm(x, self.wq[...], dt), mm(x, self.wk[...], dt)], axis=-1).astype(dt)

    def project(self, x: jax.Array, qk_halo: jax.Array | None = None, x_prev: jax.Array | None = None):
        """q, k, v of §5a–e for normed input x: [B, S, H].

        qk_halo: [B, halo, C] raw packed q‖k of the preceding tokens (zeros at a sequence start);
        x_prev: [B, 1, H] normed input of the token before x[:, 0] (zeros at a sequence start).
        Returns q [B, S, n_q, d], k [B, S, n_kv, d] (fp32: the grouped conv accumulates in fp32),
        v [B, S, n_kv, d] (compute dtype) and the raw packed c [B, S, C] in the compute dtype (callers that
        cache or exchange halos need it).
        """
        m, dt = self.cfg, layers.dtype_of(self.cfg.dtype)
        b, s, _ = x.shape
        nq, nkv, d = m.num_q_heads, m.num_kv_heads, m.head_dim
        p = lambda v: v[...].astype(dt)  # noqa: E731
        c = self.packed_qk(x)
        q0, k0 = c[..., : nq * d], c[..., nq * d :]
        qh, kh = q0.reshape(b, s, nq, d), k0.reshape(b, s, nkv, d)
        qm = (qh + jnp.repeat(kh, nq // nkv, axis=2)) * 0.5
        km = qm.reshape(b, s, nkv, nq // nkv, d).mean(axis=3)
        halo = conv_halo_len(m.cca_time0, m.cca_time1)
        if qk_halo is None:
            qk_halo = jnp.zeros((b, halo, c.shape[-1]), c.dtype)
        z = causal_convs(
            jnp.concatenate([qk_halo.astype(c.dtype), c], axis=1),
            p(self.conv1_w),
            p(self.conv1_b),
            p(self.conv2_w),
            p(self.conv2_b),
            self.kernels,
        )
        q = z[..., : nq * d].reshape(b, s, nq, d) + qm
        k = z[..., nq * d :].reshape(b, s, nkv, d) + km
        if x_prev is None:
            x_prev = jnp.zeros((b, 1, x.shape[-1]), x.dtype)
        x_shift = jnp.concatenate([x_prev.astype(x.dtype), x[:, :-1]], axis=1)
        mm = self.kernels.linear
        v = jnp.concatenate([mm(x, self.wv_cur[...], dt), mm(x_shift, self.wv_del[...], dt)], axis=-1)
        v = v.astype(dt).reshape(b, s, nkv, d)
        return q, k, v, c

    def normalize_and_rotate(self, q: jax.Array, k: jax.Array, positions: jax.Array):
        """L2 norm to √d, key temperature, then partial RoPE at integer `positions` [B|1, S] (§5f–g). fp32 out."""
        m = self.cfg
        scale = math.sqrt(m.head_dim)
        qn = l2_normalize(q, scale, m.qk_norm_eps)
        kn = l2_normalize(k, scale, m.qk_norm_eps) * layers.lead(self.temp[...].astype(jnp.float32)[:, None], k.ndim)
        cos, sin = layers.rope_tables(positions, int(m.head_dim * m.partial_rotary_factor), m.rope_theta)
        return layers.apply_partial_rope(qn, cos, sin), layers.apply_partial_rope(kn, cos, sin)

    def output(self, o: jax.Array) -> jax.Array:
        """o: [B, S, n_q, d] → [B, S, H] fp32 through W_o (§5i; fp32 accumulation feeds the fp32 residual)."""
        return self.kernels.linear(o.reshape(*o.shape[:2], -1), self.wo[...], layers.dtype_of(self.cfg.dtype))

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Full-sequence causal CCA. x: [B, S, H] normed input, positions: [B|1, S] → [B, S, H]."""
        chex.assert_rank(x, 3)
        q, k, v, _ = self.project(x)
        q, k = self.normalize_and_rotate(q, k, positions)
        dt = layers.dtype_of(self.cfg.dtype)
        return self.output(self.kernels.causal_attention(q, k, v, dt, chunk=int(self.cfg.attention_chunk)))
