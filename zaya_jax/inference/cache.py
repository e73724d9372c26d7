"""Decode cache and the cached (incremental) ZAYA1 forward pass.

`extend(model, cache, ids)` runs S new tokens per row on top of what the cache already holds and
returns their logits plus the updated cache; prefill is `extend` on an empty cache, one decode step is
`extend` with S = 1. Layers are scanned exactly as in `Zaya.hidden_states`, with the per-layer cache
slices as extra scan inputs.

Per-layer state, stacked over a leading [L] axis (spec docs/architecture.md §5):
  k       [L, B, T_max, n_kv, d] fp32   post-norm, post-temperature, post-RoPE keys (§5f–g)
  v       [L, B, T_max, n_kv, d] dtype  values after the value shift (§5e)
  conv    [L, B, halo, C]         dtype  raw packed q‖k of the last halo = (k0−1)+(k1−1) tokens (§5c)
  x_prev  [L, B, 1, H]            dtype  normed CCA input of the previous token (value shift, §5e)
Shared: `length` [] int32 (slots filled, equal for every row) and `start` [B] int32 (left-padding count:
slot t of row b holds the token at position t − start[b]; slots < start[b] are padding).

Left padding: the normed input of a pad slot is zeroed before the CCA projections, so its raw q‖k and
its delayed value are exactly 0 (q/k/v projections have no bias) — the conv halo and the value shift of
the first real token then see zeros, as at a sequence start (the HF reference zeroes padding with its
`conv_mask` the same way). Pad keys are masked out of attention; positions start at 0 at the first real
token. The EDA router state is per token and needs no cache (§6).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.config import DROPLESS_DISPATCHES
from zaya_jax.model import abstract_model, layers
from zaya_jax.model.cca import conv_halo_len
from zaya_jax.model.zaya import DecoderLayer, Zaya


class DecodeCache(NamedTuple):
    """Cached state of a batch of sequences (shapes in the module docstring). A JAX pytree."""

    k: jax.Array
    v: jax.Array
    conv: jax.Array
    x_prev: jax.Array
    length: jax.Array
    start: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def init_cache(m: ml_collections.ConfigDict, batch: int, max_len: int, start: jax.Array | None = None) -> DecodeCache:
    """An empty cache for `batch` rows of at most `max_len` tokens.

    start: [B] int number of left-pad slots per row (None = no padding).
    """
    dt = layers.dtype_of(m.dtype)
    nl, nkv, d = m.num_layers, m.num_kv_heads, m.head_dim
    c = (m.num_q_heads + nkv) * d
    halo = conv_halo_len(m.cca_time0, m.cca_time1)
    if start is None:
        start = jnp.zeros((batch,), jnp.int32)
    return DecodeCache(
        k=jnp.zeros((nl, batch, max_len, nkv, d), jnp.float32),
        v=jnp.zeros((nl, batch, max_len, nkv, d), dt),
        conv=jnp.zeros((nl, batch, halo, c), dt),
        x_prev=jnp.zeros((nl, batch, 1, m.hidden_size), dt),
        length=jnp.zeros((), jnp.int32),
        start=jnp.asarray(start, jnp.int32).reshape(batch),
    )


def dropless(model: Zaya, dispatch: str | None = None) -> Zaya:
    """The same weights with a dropless MoE dispatch (§7), so that results do not depend on which other
    tokens (padding, other rows) share the batch. Returns `model` itself if it is already dropless.

    dispatch: one of `DROPLESS_DISPATCHES` ("dropless" | "dense") | None (= keep a dropless one, else "dropless").
    """
    current = model.cfg.dispatch
    if dispatch is None:
        dispatch = current if current in DROPLESS_DISPATCHES else "dropless"
    if dispatch not in DROPLESS_DISPATCHES:
        raise ValueError(f"dispatch={dispatch!r} is not dropless; choose one of {DROPLESS_DISPATCHES}")
    if dispatch == current:
        return model
    return nnx.merge(_graphdef_with_dispatch(model.cfg, dispatch), nnx.state(model))


@functools.lru_cache(maxsize=16)
def _graphdef_with_dispatch(m: ml_collections.FrozenConfigDict, dispatch: str):
    """GraphDef of a model with config `m` but MoE dispatch `dispatch` (same variables, cached per config)."""
    changed = ml_collections.ConfigDict(m.to_dict())
    changed.dispatch = dispatch
    return nnx.graphdef(abstract_model(changed))


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dtype) -> jax.Array:
    """GQA softmax attention with an explicit mask (§5h), fp32 logits and softmax.

    q: [B, Sq, n_q, d] fp32, k: [B, Sk, n_kv, d], v: [B, Sk, n_kv, d], mask: [B, Sq, Sk] bool (every query
    row must allow at least one key). Returns [B, Sq, n_q, d] in `dtype`.
    """
    b, sq, n_q, d = q.shape
    n_kv = k.shape[2]
    qg = q.astype(jnp.float32).reshape(b, sq, n_kv, n_q // n_kv, d)
    logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k.astype(jnp.float32)) / jnp.sqrt(jnp.float32(d))
    logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1).astype(dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v.astype(dtype))
    return out.reshape(b, sq, n_q, d)


class LayerCache(NamedTuple):
    """One layer's slice of `DecodeCache` (no [L] axis)."""

    k: jax.Array  # [B, T_max, n_kv, d]
    v: jax.Array  # [B, T_max, n_kv, d]
    conv: jax.Array  # [B, halo, C]
    x_prev: jax.Array  # [B, 1, H]


def layer_extend(
    layer: DecoderLayer,
    r: jax.Array,
    a: jax.Array,
    lc: LayerCache,
    length: jax.Array,
    real: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
):
    """One decoder layer (§2) on S new tokens with cached context.

    r: [B, S, H] fp32 residual; a: [B, S, R] fp32 router state; real: [B, S] bool (False = pad slot);
    positions: [B, S] int32; mask: [B, S, T_max] bool. Returns (r, a, (k_new, v_new, conv, x_prev)) with
    k_new/v_new [B, S, n_kv, d] the entries for slots [length, length + S) and conv/x_prev the new states.
    """
    attn = layer.attn
    dt = layers.dtype_of(attn.cfg.dtype)
    x = layer.attn_norm(r)
    x = jnp.where(real[..., None], x, jnp.zeros((), x.dtype))  # pads contribute exact zeros to halo / shift
    q, k, v, c = attn.project(x, qk_halo=lc.conv, x_prev=lc.x_prev)
    q, k = attn.normalize_and_rotate(q, k, positions)
    k_all = jax.lax.dynamic_update_slice_in_dim(lc.k, k.astype(lc.k.dtype), length, axis=1)
    v_all = jax.lax.dynamic_update_slice_in_dim(lc.v, v.astype(lc.v.dtype), length, axis=1)
    r = layer.attn_merge(attn.output(masked_attention(q, k_all, v_all, mask, dt)), r)
    z, a, _ = layer.moe(layer.moe_norm(r), a)
    r = layer.moe_merge(z, r)
    halo = lc.conv.shape[1]
    packed = jnp.concatenate([lc.conv, c.astype(lc.conv.dtype)], axis=1)
    conv = packed[:, packed.shape[1] - halo :]
    return r, a, (k.astype(lc.k.dtype), v.astype(lc.v.dtype), conv, x[:, -1:].astype(lc.x_prev.dtype))


def attention_mask(slots: jax.Array, start: jax.Array, max_len: int) -> jax.Array:
    """[B, S, T_max] bool: causal over cache slots, pad keys masked. slots: [S] int32 of the queries.

    A pad query (slot < start) may see only itself, which keeps its softmax finite (its output is unused).
    """
    keys = jnp.arange(max_len, dtype=jnp.int32)[None, None, :]
    qs = slots[None, :, None]
    return (keys <= qs) & ((keys >= start[:, None, None]) | (keys == qs))


def extend(
    model: Zaya, cache: DecodeCache, ids: jax.Array, *, last_only: bool = False
) -> tuple[jax.Array, DecodeCache]:
    """Feed ids [B, S] at cache slots [length, length + S). Returns (logits fp32 [B, S or 1, V], cache).

    Pure (jit it from outside). The caller keeps length + S ≤ max_len: dynamic_update_slice clamps.
    last_only: compute the head for the last position only (prefill before sampling).
    """
    m = model.cfg
    b, s = ids.shape
    slots = cache.length + jnp.arange(s, dtype=jnp.int32)
    real = slots[None, :] >= cache.start[:, None]
    positions = jnp.maximum(slots[None, :] - cache.start[:, None], 0)
    mask = attention_mask(slots, cache.start, cache.max_len)

    r = model.embed_tokens(ids)
    a = jnp.zeros((b, s, m.router_hidden_size), jnp.float32)
    graphdef, stacked = nnx.split(model.layers)

    def body(carry, xs):
        r, a = carry
        layer_state, lc = xs
        r, a, new = layer_extend(
            nnx.merge(graphdef, layer_state), r, a, LayerCache(*lc), cache.length, real, positions, mask
        )
        return (r, a), new

    (r, _), (k_new, v_new, conv, x_prev) = jax.lax.scan(
        body, (r, a), (stacked, (cache.k, cache.v, cache.conv, cache.x_prev))
    )
    new_cache = cache._replace(
        k=jax.lax.dynamic_update_slice_in_dim(cache.k, k_new, cache.length, axis=2),
        v=jax.lax.dynamic_update_slice_in_dim(cache.v, v_new, cache.length, axis=2),
        conv=conv,
        x_prev=x_prev,
        length=cache.length + s,
    )
    if last_only:
        r = r[:, -1:]
    return model.logits(model.final_norm(r)), new_cache
