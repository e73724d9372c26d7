"""XLA:CPU specialisations of the mixed-precision GEMM (the `xla_cpu` matmul kernel, docs/kernels.md).

XLA:CPU runs a bf16 GEMM on its fast path (AMX / AVX-512 bf16) only when the lhs contracts its minor axis and
the rhs its major axis, both row-major; any other layout is upcast and runs at the fp32 rate
(benchmarks/README.md, "bf16 GEMM layouts"). And it performs a bf16 dynamic-update-slice in fp32 on a
converted copy of the whole buffer, which the layer scan does for every stacked residual. So, for bf16:

* `gemm_layout_einsum` runs any einsum as one batched GEMM on operands permuted into that layout;
* `as_bits` / `from_bits` keep buffers that are written or stacked piecewise as uint16 bit patterns.

Nothing here is used unless the `xla_cpu` matmul or the `loops` grouped-GEMM kernel is chosen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint


def as_bits(x: jax.Array) -> jax.Array:
    """bf16 as its uint16 bit pattern (any other dtype unchanged); `from_bits` undoes it."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x


def from_bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x


def gemm_layout_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`einsum(spec, a, b)` (no ellipsis) as one batched GEMM [batch, M, K] · [batch, K, N] on row-major
    operand copies; fp32 accumulation and result in `spec`'s order.

    Batch indices (in a, b and the output) and free indices keep the output's order, so for the attention and
    CCA-conv einsums only operands are permuted (a copy each where their order differs), never the result."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    batch = "".join(c for c in out if c in sa and c in sb)
    free_a = "".join(c for c in out if c in sa and c not in sb)
    free_b = "".join(c for c in out if c in sb and c not in sa)
    contract = "".join(c for c in sa if c in sb and c not in out)
    la, lb, lo = batch + free_a + contract, batch + contract + free_b, batch + free_a + free_b
    y = jnp.einsum(f"{la},{lb}->{lo}", _permuted(a, sa, la), _permuted(b, sb, lb), preferred_element_type=jnp.float32)
    return y if lo == out else jnp.transpose(y, [lo.index(c) for c in out])


def _permuted(x: jax.Array, src: str, dst: str) -> jax.Array:
    """x with axes `src` reordered to `dst` as a row-major copy; x itself when already in order."""
    return x if src == dst else permuted_copy(x, [src.index(c) for c in dst])


def transposed(x: jax.Array) -> jax.Array:
    """xᵀ (the last two axes swapped) as a row-major copy, for a GEMM operand that must be in the forward layout.

    Pinning both x and xᵀ to row-major layouts makes XLA materialise x (a cheap copy out of the layer scan's
    stacked residuals) and transpose it with its fast transpose emitter, instead of folding the transpose into
    the GEMM or into the scan's dynamic slice."""
    return permuted_copy(x, [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2])


def permuted_copy(x: jax.Array, perm: list[int]) -> jax.Array:
    """`jnp.transpose(x, perm)` materialised as a row-major array from a row-major x."""
    return _row_major(jnp.transpose(_row_major(x), perm))


def _row_major(x: jax.Array) -> jax.Array:
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))
