"""Grouped-query causal softmax attention, the last step of CCA (docs/architecture.md §5h, docs/kernels.md).

Two implementations (`model.kernels.attention`):

* `xla`: einsums (`zaya_jax.kernels.matmul`) over query blocks (`model.attention_chunk`): QKᵀ and PV with
  compute-dtype operands and fp32 accumulation, fp32 logits and softmax. Runs everywhere.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's fused flash attention (CUDA, bf16):
  the S×S logits never reach memory. cuDNN queries the local GPU when it is lowered, so a program using it
  can only be built on a CUDA host. Context-parallel blocks (a traced query offset) run `xla`.
* `pallas`: jax's Pallas Triton flash attention (`jax.experimental.pallas.ops.gpu.attention.mha`, forward and
  backward Triton kernels, bf16) for ROCm and CUDA: the S×S logits never reach memory. It compiles to
  `__gpu$xla.gpu.triton` custom calls; on CPU it runs interpreted (slow: for tests). Context-parallel blocks and
  shapes it cannot tile (sequence not a multiple of 16, head dim not a power of two) run `xla`.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zaya_jax.kernels import matmul
from zaya_jax.parallel.mesh import BATCH_AXES, active_mesh, in_manual_region

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


def pallas_fits(seq_len: int, head_dim: int) -> bool:
    """Whether the `pallas` kernel tiles this shape: query/key blocks of at least 16 rows that divide the sequence
    (Triton's smallest dot) and a power-of-two head dim (its tiles are never padded)."""
    return math.gcd(seq_len, 32) >= 16 and head_dim & (head_dim - 1) == 0


def _pallas_mha():
    """jax's Pallas Triton `mha` (imported on first use; its module warns that it is deprecated in favour of
    tokamax, which this project does not require)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention

    return attention


def pallas_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, dtype, interpret: bool = False) -> jax.Array:
    """The `pallas` kernel: causal flash attention with scale 1/√d on `dtype` operands, GQA by repeating each kv
    head for its group of query heads (the repeat's transpose sums the group's k/v gradients). Shapes as
    `causal_attention` with Sq = Sk and no offset (`pallas_fits`); returns [B, S, n_q, d] in `dtype`. Forward
    blocks of up to 64 queries × 64 keys (the q, k and v tiles of 128-dim heads then fit MI300X's 64 KB of LDS;
    128 × 128 needs 96 KB and does not compile for it), backward blocks of up to 32 × 32. Under a GSPMD mesh it
    runs per device over the batch shards (a custom call has no partitioning rule of its own).
    interpret: run the kernels in Pallas's interpreter (CPU)."""
    attention = _pallas_mha()
    s, group = q.shape[1], q.shape[2] // k.shape[2]
    fwd, bwd = math.gcd(s, 64), math.gcd(s, 32)
    blocks = attention.BlockSizes(
        block_q=fwd, block_k=fwd, block_q_dkv=bwd, block_kv_dkv=bwd, block_q_dq=bwd, block_kv_dq=bwd
    )

    def local(q, k, v):
        q, k, v = (t.astype(dtype) for t in (q, k, v))
        k, v = (jnp.repeat(t, group, axis=2) for t in (k, v))
        scale = 1.0 / math.sqrt(q.shape[-1])
        return attention.mha(q, k, v, None, sm_scale=scale, causal=True, block_sizes=blocks, interpret=interpret)

    mesh = active_mesh()
    if mesh is None or mesh.size == 1 or in_manual_region():
        return local(q, k, v)
    spec = P(BATCH_AXES)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(q, k, v)
