"""Context parallelism (CP) for CCA: the sequence is split over the `context` mesh axis
(arXiv 2511.17127 §2; docs/parallelism.md).

Shapes: B batch, S sequence, n = size of the `context` axis, S_l = S / n local tokens, H hidden,
C = (n_q + n_kv)·d packed conv channels, halo = `conv_halo_len` (2 for ZAYA1).

Inside `jax.shard_map` each device holds its tokens of every sequence and runs CCA on them:

1. halos over `ppermute`: the last `halo` raw packed q‖k vectors [B, halo, C] and the last normed input
   [B, 1, H] (the delayed value's x_{t-1}) of the *preceding* chunk; the first chunk of a sequence gets
   zeros, exactly like the full-sequence left padding, so the two valid convolutions are exact (§5c, e);
2. q, k, v of the local tokens with `CCA.project(x, qk_halo, x_prev)`, L2 norm and RoPE at absolute positions;
3. `all_gather` over `context` of the compressed post-RoPE K and V only (n_kv heads: 2·n_kv·d values per
   token) — queries, activations and the residual stream never leave their device;
4. causal attention of the local queries at their absolute positions against all keys, then W_o.

Layouts (`mesh.context_layout`):
* `contiguous`: device i holds tokens [i·S_l, (i+1)·S_l). Attention is dense over all S keys (masked).
* `zigzag`: the sequence is cut into 2n chunks of c = S / 2n tokens and device i holds chunks i and 2n−1−i
  (order 0, 2n−1, 1, 2n−2, … along the axis). The model runs its whole layer stack in this token order
  (`to_layout` on the ids, `from_layout` on the final hidden state; every other op is per token). Halos
  come from the logically preceding chunk. Attention only computes the 2n+1 causally needed c×c blocks
  on every device (instead of 2c × S), which halves attention FLOPs and logit memory and balances the work.
"""

from __future__ import annotations

import math
from functools import partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from zaya_jax.config import CONTEXT_CHUNKS, CONTEXT_LAYOUTS
from zaya_jax.model.cca import CCA, conv_halo_len
from zaya_jax.model.layers import dtype_of
from zaya_jax.parallel.mesh import AXES, BATCH_AXES, in_manual_region

AXIS = "context"


def chunks_per_device(layout: str) -> int:
    """Sequence chunks each device holds: 1 (contiguous) or 2 (zigzag)."""
    if layout not in CONTEXT_CHUNKS:
        raise ValueError(f"context layout {layout!r}; choose one of {CONTEXT_LAYOUTS}")
    return CONTEXT_CHUNKS[layout]


def context_size() -> int:
    """Size of the `context` axis of the active (abstract) mesh; 1 without a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return 1
    return int(mesh.shape[AXIS])


def active_layout(batch: int, seq: int, layout: str, halo: int) -> str | None:
    """The layout CP uses for a [batch, seq] input under the active mesh, or None (plain GSPMD CCA).

    CP needs a `context` axis > 1, the batch divisible by the batch axes (data × expert) and the sequence
    by n · chunks_per_device with chunks of at least `halo` tokens; otherwise the ordinary path runs.
    """
    per = chunks_per_device(layout)
    n = context_size()
    if n == 1:
        return None
    if in_manual_region():  # per-device arrays in the ZeRO-1 step, whose layout was checked up front
        return layout
    mesh = jax.sharding.get_abstract_mesh()
    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if batch % shards or seq % (n * per) or seq // (n * per) < max(halo, 1):
        return None
    return layout


def chunk_home(chunk: int, n: int, layout: str) -> tuple[int, int]:
    """(device, slot) of global chunk `chunk` of 2n (zigzag) or n (contiguous) chunks."""
    if layout == "contiguous":
        return chunk, 0
    return (chunk, 0) if chunk < n else (2 * n - 1 - chunk, 1)


def local_positions(seq_local: int, layout: str) -> jax.Array:
    """Inside a manual `shard_map`: absolute positions [1, S_l] of this device's tokens in `layout` order."""
    n = jax.lax.axis_size(AXIS)
    table = jnp.asarray(layout_positions(seq_local * n, n, layout))
    return jax.lax.dynamic_slice_in_dim(table, jax.lax.axis_index(AXIS) * seq_local, seq_local, axis=1)


def layout_positions(seq: int, n: int, layout: str) -> np.ndarray:
    """Absolute positions [1, S] of the tokens in `layout` order along the sequence axis."""
    per = chunks_per_device(layout)
    c = seq // (n * per)
    order = sorted(range(n * per), key=lambda j: chunk_home(j, n, layout))
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in order]).astype(np.int32)[None, :]


def _seq_spec(x: jax.Array) -> P:
    """[B|1, S, ...] → batch over (data, expert) unless the leading dim is a broadcast 1, sequence over context."""
    return P(BATCH_AXES if x.shape[0] > 1 else None, AXIS, *([None] * (x.ndim - 2)))


def _move_chunks(x: jax.Array, src: str, dst: str) -> jax.Array:
    """Per-device body: x [B, 2c, ...] in layout `src` → the same tokens in layout `dst` (≤ 4 ppermutes)."""
    n = jax.lax.axis_size(AXIS)
    c = x.shape[1] // 2
    slots = (x[:, :c], x[:, c:])
    natural = lambda j: (j // 2, j % 2)  # noqa: E731  (2 consecutive chunks per device)
    home = {"natural": natural, "zigzag": lambda j: chunk_home(j, n, "zigzag")}
    out = [jnp.zeros_like(slots[0]), jnp.zeros_like(slots[1])]
    for s in (0, 1):
        for t in (0, 1):
            perm = [
                (home[src](j)[0], home[dst](j)[0])
                for j in range(2 * n)
                if home[src](j)[1] == s and home[dst](j)[1] == t
            ]
            if perm:
                out[t] = out[t] + jax.lax.ppermute(slots[s], AXIS, perm)
    return jnp.concatenate(out, axis=1)


def _reorder(x: jax.Array, src: str, dst: str) -> jax.Array:
    chex.assert_rank(x, {2, 3, 4})
    if in_manual_region():
        return _move_chunks(x, src, dst)
    mesh = jax.sharding.get_abstract_mesh()
    spec = _seq_spec(x)
    return jax.shard_map(partial(_move_chunks, src=src, dst=dst), mesh=mesh, in_specs=spec, out_specs=spec)(x)


def to_layout(x: jax.Array, layout: str) -> jax.Array:
    """[B|1, S, ...] in natural token order → `layout` order (identity for contiguous)."""
    return x if layout == "contiguous" else _reorder(x, "natural", layout)


def from_layout(x: jax.Array, layout: str) -> jax.Array:
    """Inverse of `to_layout`."""
    return x if layout == "contiguous" else _reorder(x, layout, "natural")


def _from_previous(x: jax.Array, n: int) -> jax.Array:
    """Device i receives device i−1's x; device 0 receives zeros."""
    return jax.lax.ppermute(x, AXIS, [(i, i + 1) for i in range(n - 1)])


def _from_next(x: jax.Array, n: int) -> jax.Array:
    """Device i receives device i+1's x; device n−1 receives zeros."""
    return jax.lax.ppermute(x, AXIS, [(i + 1, i) for i in range(n - 1)])


def _halos(attn: CCA, chunks: list[jax.Array], layout: str, halo: int):
    """(qk_halo [B, halo, C], x_prev [B, 1, H]) for each local chunk [B, c, H], from the preceding chunk."""
    n, idx = jax.lax.axis_size(AXIS), jax.lax.axis_index(AXIS)
    tails = [(attn.packed_qk(x[:, -halo:]), x[:, -1:]) for x in chunks]
    first = [_from_previous(t, n) for t in tails[0]]  # chunk i ← chunk i−1 (device i−1, same slot)
    if layout == "contiguous":
        return [first]
    # zigzag: chunk 2n−1−i ← chunk 2n−2−i = slot 1 of device i+1, or (i = n−1) chunk n−1 = own slot 0
    second = [jnp.where(idx == n - 1, own, _from_next(t, n)) for own, t in zip(tails[0], tails[1])]
    return [first, second]


def _gather_chunks(x: jax.Array, layout: str, per: int) -> jax.Array:
    """Local [B, per·c, n_kv, d] → all tokens [B, S, n_kv, d] in natural order (all_gather over context)."""
    g = jax.lax.all_gather(x, AXIS, axis=1, tiled=False)  # [B, n, per·c, n_kv, d]
    if layout == "contiguous":
        return g.reshape(g.shape[0], -1, *g.shape[3:])
    b, n, two_c = g.shape[:3]
    g = g.reshape(b, n, 2, two_c // 2, *g.shape[3:])
    nat = jnp.concatenate([g[:, :, 0], g[:, ::-1, 1]], axis=1)  # chunks 0..n−1, then n..2n−1
    return nat.reshape(b, -1, *g.shape[4:])


def zigzag_attention(q: jax.Array, k: jax.Array, v: jax.Array, dtype, idx: jax.Array, n: int) -> jax.Array:
    """Causal attention of device `idx`'s zigzag queries with only the causally needed key blocks.

    q: [B, 2c, n_q, d] fp32 (chunk idx, then chunk 2n−1−idx); k: [B, S, n_kv, d] fp32 and v: [B, S, n_kv, d]
    in natural order (S = 2n·c). Block j = 0..2n pairs query chunk a = idx with key chunk j (j ≤ idx) or
    query chunk b = 2n−1−idx with key chunk j−idx−1; the 2n+1 blocks are combined per query chunk with a
    log-sum-exp merge (exact). Returns [B, 2c, n_q, d] in `dtype`.
    """
    b, two_c, n_q, d = q.shape
    c, n_kv = two_c // 2, k.shape[2]
    g, nb = n_q // n_kv, 2 * n + 1
    j = jnp.arange(nb)
    use_a = j <= idx
    q_chunk = jnp.where(use_a, idx, 2 * n - 1 - idx)
    k_chunk = jnp.where(use_a, j, j - idx - 1)
    qs = jnp.where(use_a[None, :, None, None, None], q[:, None, :c], q[:, None, c:])  # [B, J, c, n_q, d]
    qs = qs.reshape(b, nb, c, n_kv, g, d)
    ks = jnp.take(k.reshape(b, 2 * n, c, n_kv, d), k_chunk, axis=1).astype(jnp.float32)  # [B, J, c, n_kv, d]
    vs = jnp.take(v.reshape(b, 2 * n, c, n_kv, d), k_chunk, axis=1).astype(dtype)
    logits = jnp.einsum("bjqkgd,bjskd->bjkgqs", qs, ks) / math.sqrt(d)
    q_pos = q_chunk[:, None] * c + jnp.arange(c)[None, :]  # [J, c]
    k_pos = k_chunk[:, None] * c + jnp.arange(c)[None, :]
    mask = k_pos[:, None, :] <= q_pos[:, :, None]  # [J, c_q, c_k]; every row keeps ≥ 1 key
    logits = jnp.where(mask[None, :, None, None], logits, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1))  # [B, J, n_kv, g, c] (any shift is exact)
    p = jnp.exp(logits - m[..., None])
    l_sum = jnp.sum(p, axis=-1)
    o = jnp.einsum("bjkgqs,bjskd->bjkgqd", p.astype(dtype), vs, preferred_element_type=jnp.float32)

    def merge(seg: jax.Array) -> jax.Array:  # seg: [J] bool → [B, c, n_kv, g, d]
        sel = seg[None, :, None, None, None]
        top = jax.lax.stop_gradient(jnp.max(jnp.where(sel, m, -jnp.inf), axis=1, keepdims=True))
        w = jnp.exp(jnp.where(sel, m - top, -jnp.inf))  # 0 outside the segment
        out = jnp.sum(w[..., None] * o, axis=1) / jnp.sum(w * l_sum, axis=1)[..., None]
        return out.transpose(0, 3, 1, 2, 4)

    out = jnp.concatenate([merge(use_a), merge(~use_a)], axis=1)
    return out.reshape(b, two_c, n_q, d).astype(dtype)


def _local_cca(state, x: jax.Array, positions: jax.Array, *, graphdef, layout: str) -> jax.Array:
    """Per-device body. x: [B_l, per·c, H] local normed input, positions: [B_l|1, per·c] → [B_l, per·c, H]."""
    attn: CCA = nnx.merge(graphdef, state)
    m = attn.cfg
    dt, halo = dtype_of(m.dtype), conv_halo_len(m.cca_time0, m.cca_time1)
    n, idx = jax.lax.axis_size(AXIS), jax.lax.axis_index(AXIS)
    per = chunks_per_device(layout)
    b, s_local, _ = x.shape
    c = s_local // per
    chunks = [x[:, i * c : (i + 1) * c] for i in range(per)]
    halos = _halos(attn, chunks, layout, halo)
    # one projection for all local chunks: stack them along the batch
    q, k, v, _ = attn.project(jnp.concatenate(chunks, 0), *(jnp.concatenate(h, 0) for h in zip(*halos)))
    unstack = lambda a: jnp.concatenate(jnp.split(a, per, axis=0), axis=1)  # noqa: E731  [per·B, c] → [B, per·c]
    q, k, v = unstack(q), unstack(k), unstack(v)
    q, k = attn.normalize_and_rotate(q, k, positions)
    k_all, v_all = _gather_chunks(k, layout, per), _gather_chunks(v, layout, per)
    if layout == "contiguous":
        o = attn.kernels.causal_attention(q, k_all, v_all, dt, q_offset=idx * s_local)
    else:
        o = zigzag_attention(q, k_all, v_all, dt, idx, n)
    return attn.output(o)


def cca_forward(attn: CCA, x: jax.Array, positions: jax.Array, layout: str) -> jax.Array:
    """Context-parallel `attn(x, positions)` under the active mesh.

    x: [B, S, H] normed input in `layout` token order (sequence sharded over `context`), positions:
    [B|1, S] absolute positions in the same order. Returns [B, S, H] like `CCA.__call__`.
    """
    chex.assert_rank(x, 3)
    chex.assert_rank(positions, 2)
    chex.assert_equal(positions.shape[1], x.shape[1])
    graphdef, state = nnx.split(attn)
    body = partial(_local_cca, graphdef=graphdef, layout=layout)
    if in_manual_region():
        return body(state, x, positions)
    mesh = jax.sharding.get_abstract_mesh()
    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(), _seq_spec(x), _seq_spec(positions)), out_specs=_seq_spec(x))
    out = fn(state, x, positions)
    chex.assert_shape(out, x.shape)
    return out
