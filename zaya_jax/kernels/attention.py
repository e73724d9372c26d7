"""Grouped-query causal softmax attention, the last step of CCA (docs/architecture.md §5h, docs/kernels.md).

Two implementations (`model.kernels.attention`):

* `xla`: einsums (`zaya_jax.kernels.matmul`) over query blocks (`model.attention_chunk`): QKᵀ and PV with
  compute-dtype operands and fp32 accumulation, fp32 logits and softmax. Runs everywhere.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's fused flash attention (CUDA, bf16):
  the S×S logits never reach memory. cuDNN queries the local GPU when it is lowered, so a program using it
  can only be built on a CUDA host. Context-parallel blocks (a traced query offset) run `xla`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from zaya_jax.kernels import matmul

MAX_ATTENTION_BLOCKS = 16  # each block is its own ops in the program: longer sequences get longer blocks


def attention_chunks(seq_len: int, chunk: int) -> int:
    """Equal query blocks `causal_attention` splits a length-`seq_len` sequence into (1 = the whole square):
    the most, up to seq_len // chunk and MAX_ATTENTION_BLOCKS, that divide seq_len."""
    if not 0 < chunk < seq_len:
        return 1
    n = min(seq_len // chunk, MAX_ATTENTION_BLOCKS)
    while seq_len % n:
        n -= 1
    return n


def _attend(q, k, v, dtype, q_offset, impl: str) -> jax.Array:
    """Masked softmax attention of all of `q` against all of `k`/`v` (shapes as in `causal_attention`)."""
    b, sq, n_q, d = q.shape
    n_kv = k.shape[2]
    qg = q.reshape(b, sq, n_kv, n_q // n_kv, d)
    logits = matmul.einsum("bqkgd,bskd->bkgqs", qg, k, dtype, impl) / math.sqrt(d)
    q_pos = q_offset + jnp.arange(sq)[:, None]
    mask = jnp.arange(k.shape[1])[None, :] <= q_pos
    logits = jnp.where(mask, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    out = matmul.einsum("bkgqs,bskd->bqkgd", probs, v, dtype, impl)
    return out.reshape(b, sq, n_q, d).astype(dtype)


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, dtype, q_offset: int | jax.Array = 0, chunk: int = 0, impl: str = "xla"
) -> jax.Array:
    """The `xla` kernel. q: [B, Sq, n_q, d] fp32, k: [B, Sk, n_kv, d] fp32, v: [B, Sk, n_kv, d]; query i sits at
    absolute position q_offset + i and key j at position j. Returns [B, Sq, n_q, d] in `dtype`. impl: the
    matmul kernel of its two einsums.

    chunk > 0 splits the queries into `attention_chunks(Sq, chunk)` equal blocks, each attending only to the
    keys up to its own end: the S×S logits never exist at once and the fully masked blocks above the diagonal
    are not computed — (n + 1) / 2n of the square's FLOPs for n blocks. Each row's softmax still sees every key
    it may attend to, so the result is the same up to rounding. Needs a static `q_offset` (the
    context-parallel path, whose offset is traced, uses the square).
    """
    n = attention_chunks(q.shape[1], chunk) if isinstance(q_offset, int) else 1
    if n == 1:
        return _attend(q, k, v, dtype, q_offset, impl)
    c = q.shape[1] // n
    blocks = []
    for i in range(n):
        end = min(k.shape[1], q_offset + (i + 1) * c)
        blocks.append(_attend(q[:, i * c : (i + 1) * c], k[:, :end], v[:, :end], dtype, q_offset + i * c, impl))
    return jnp.concatenate(blocks, axis=1)


def fused_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, dtype, implementation: str) -> jax.Array:
    """The fused kernels: `jax.nn.dot_product_attention` (causal, scale 1/√d, GQA by head groups) on `dtype`
    operands. Shapes as `causal_attention` with Sq = Sk and no offset; returns [B, S, n_q, d] in `dtype`."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v = (t.astype(dtype) for t in (q, k, v))
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation=implementation)
