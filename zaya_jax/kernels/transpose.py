"""A batched matrix transpose as its own GPU kernel: w [B, K, N] → [B, N, K] row-major (docs/kernels.md, tokamax).

XLA implements a transpose by choosing layouts, and it may push that choice far from the op: the per-layer
transpose of the expert weights that tokamax's input gradient needs became a transposed copy of the whole
[L, E, ...] weight stack that the layer scan slices. A Pallas (Triton) kernel is a custom call with row-major
operand and result, so the transpose stays where it is written: one layer's [E, K, N] slice at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BLOCK = 64  # rows and columns per tile; K and N must be multiples of it (the GPU configs' 2048 / 4096 are)


def fits(shape: tuple[int, ...]) -> bool:
    """Whether `pallas_transpose` tiles w of `shape` ([B, K, N])."""
    return len(shape) == 3 and shape[1] % BLOCK == 0 and shape[2] % BLOCK == 0


def _tile(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def pallas_transpose(w: jax.Array, interpret: bool = False) -> jax.Array:
    """w [B, K, N] → [B, N, K] (a `swapaxes(1, 2)`) in one Pallas kernel; `interpret` runs it on CPU (tests)."""
    from jax.experimental import pallas as pl  # optional at import time: only the GPU paths call it

    b, k, n = w.shape
    return pl.pallas_call(
        _tile,
        grid=(b, k // BLOCK, n // BLOCK),
        in_specs=[pl.BlockSpec((None, BLOCK, BLOCK), lambda e, i, j: (e, i, j))],
        out_specs=pl.BlockSpec((None, BLOCK, BLOCK), lambda e, i, j: (e, j, i)),
        out_shape=jax.ShapeDtypeStruct((b, n, k), w.dtype),
        interpret=interpret,
    )(w)


def transposed(w: jax.Array, platform: str) -> jax.Array:
    """w [B, K, N] → [B, N, K]: the Pallas kernel on a GPU platform where it tiles the shape, else `swapaxes`."""
    if platform in ("cuda", "rocm") and fits(w.shape):
        return pallas_transpose(w)
    return jnp.swapaxes(w, 1, 2)
