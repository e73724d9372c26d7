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


def default_device_is_gpu() -> bool:
    """Whether jax's default device is a GPU: on a GPU host, and in a compile for a GPU target from any host
    (`zaya_jax.planning.gpu_compile` traces under the target's device), as tokamax decides; not when a CPU host
    lowers for a GPU platform without its description (`launch.gpu_check --lower`), where Triton cannot lower."""
    device = jax.config.jax_default_device
    platform = getattr(device, "platform", device) or jax.default_backend()
    return platform in ("gpu", "cuda", "rocm")


def transposed(w: jax.Array, platform: str) -> jax.Array:
    """w [B, K, N] → [B, N, K]: the Pallas kernel for a GPU platform where it tiles the shape and can lower, else
    `swapaxes` (the transpose XLA is free to fold into layouts)."""
    if platform in ("cuda", "rocm") and fits(w.shape) and default_device_is_gpu():
        return pallas_transpose(w)
    return jnp.swapaxes(w, 1, 2)
