"""The mixed-precision GEMM every model matmul goes through (docs/architecture.md §9, docs/kernels.md).

Operands in the compute dtype, fp32 accumulation and result, in the forward and in both backward GEMMs (plain
autodiff would upcast the saved operands and run the backward in fp32). Two implementations (`model.kernels.matmul`):

* `xla`: `jnp.einsum(..., preferred_element_type=float32)`; XLA picks layouts (GPU: cuBLAS / hipBLASLt).
* `xla_cpu`: the same, with XLA:CPU's bf16 specialisations (`zaya_jax.kernels.xla_cpu`): every bf16 GEMM in the
  forward layout, residuals kept as bits. fp32 is identical to `xla`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from zaya_jax.kernels import xla_cpu
from zaya_jax.parallel.mesh import active_mesh, in_manual_region

MATMUL, BATCHED_MATMUL = "matmul", "batched_matmul"  # `checkpoint_name`s of einsum outputs (remat policies)
TOKEN_MATMUL = "tk,kn->tn"


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype, impl: str) -> jax.Array:
    """`jnp.einsum(spec, a, b)` with `dtype` operands and an fp32 result, by kernel `impl` ("xla" | "xla_cpu").
    The output is named `MATMUL` (or `BATCHED_MATMUL` when an index appears in both operands and the output)
    so remat policies can save it."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    batched = bool(set(sa) & set(sb) & set(out) - set("."))
    y = _mixed_einsum(spec, impl, a.astype(dtype), b.astype(dtype))
    return checkpoint_name(y, BATCHED_MATMUL if batched else MATMUL)


def matmul(x: jax.Array, w: jax.Array, dtype, impl: str) -> jax.Array:
    """`x @ w` as `einsum`: x [..., K], w [K, N] → [..., N] fp32. Callers cast when they need `dtype`.

    Where that is a local reshape (`flat_tokens_are_local`) the leading axes are merged into one token axis
    first, so the weight gradient `xᵀ·g` contracts a single axis (with several, XLA:CPU first copies x into a
    transposed layout: ≈ 19% of the 100M CPU step, benchmarks/README.md)."""
    if x.ndim == 2 or not flat_tokens_are_local():
        return einsum("...k,kn->...n", x, w, dtype, impl)
    y = einsum(TOKEN_MATMUL, x.reshape(-1, x.shape[-1]), w, dtype, impl)
    return y.reshape(*x.shape[:-1], w.shape[-1])


def weight_grad(a: jax.Array, g: jax.Array, impl: str) -> jax.Array:
    """Σ_t a[t]ᵀ g[t]: a [..., K], g [..., N] (same dtype) → [K, N] fp32, the weight gradient of `a @ w`.
    One contraction over a flat token axis; several leading axes (see `flat_tokens_are_local`) contract as
    they are."""
    if a.ndim > 2:
        return jnp.einsum("...k,...n->kn", a, g, preferred_element_type=jnp.float32)
    return _einsum_f32("tk,tn->kn", a, g, impl)


def flat_tokens_are_local() -> bool:
    """Whether merging the [batch, seq] axes of an activation into one token axis is a local reshape: without a
    mesh, inside the manual ZeRO-1 step, or under a GSPMD mesh whose sequence is not split (context axis 1).
    With the sequence split over `context`, GSPMD would gather whole sequences to merge the axes."""
    mesh = active_mesh()
    return mesh is None or in_manual_region() or mesh.shape["context"] == 1


def _einsum_f32(spec: str, a: jax.Array, b: jax.Array, impl: str) -> jax.Array:
    if impl == "xla_cpu" and a.dtype == jnp.bfloat16 and "." not in spec:
        return xla_cpu.gemm_layout_einsum(spec, a, b)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _saved(x: jax.Array, impl: str) -> jax.Array:
    return xla_cpu.as_bits(x) if impl == "xla_cpu" else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _mixed_einsum(spec: str, impl: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return _einsum_f32(spec, a, b, impl)


def _mixed_einsum_fwd(spec, impl, a, b):
    return _mixed_einsum(spec, impl, a, b), (_saved(a, impl), _saved(b, impl))


def _mixed_einsum_bwd(spec, impl, res, g):
    """da = g·b over the indices of a, db = a·g over those of b (every index of one operand appears in the other
    or in the output: no reduction over an operand-only index, true of every einsum in this model)."""
    a, b = (xla_cpu.from_bits(r) for r in res)
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    g = g.astype(a.dtype)
    da, db = _einsum_f32(f"{out},{sb}->{sa}", g, b, impl), _einsum_f32(f"{sa},{out}->{sb}", a, g, impl)
    return _like(da.astype(a.dtype), a), _like(db.astype(b.dtype), b)


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def _like(cotangent: jax.Array, primal: jax.Array) -> jax.Array:
    """Inside a `shard_map` that checks replication, sum a cotangent over the mesh axes along which it varies but
    its primal does not (what autodiff does for a replicated operand: its gradient is the sum over devices)."""
    extra = tuple(sorted(_varying_axes(cotangent) - _varying_axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent


def _varying_axes(x: jax.Array) -> frozenset:
    """Mesh axes along which `x` may differ between devices (`vma` in newer jax, `manual_axis_type` in 0.10)."""
    aval = jax.typeof(x)
    if hasattr(aval, "vma"):
        return frozenset(aval.vma)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset()
