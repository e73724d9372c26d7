"""Small shared pieces: dtypes, initialisers, RMSNorm (§4), partial RoPE (§5g) and residual scaling (§3).

Section numbers (§) refer to docs/architecture.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.layout import Layout, with_layout_constraint

from zaya_jax.parallel.mesh import active_mesh, in_manual_region


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


MATMUL, BATCHED_MATMUL = "matmul", "batched_matmul"  # `checkpoint_name`s of einsum outputs (remat policies)


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """`jnp.einsum(spec, a, b)` as the hardware's mixed-precision GEMM: operands in the compute `dtype`, fp32
    accumulation and result (§9). The backward GEMMs are mixed-precision too (the fp32 cotangent is cast to
    `dtype`); plain autodiff would upcast the saved operands and run them in fp32. The output is named
    `MATMUL` (or `BATCHED_MATMUL` when an index appears in both operands and the output) so remat policies
    can save it."""
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    batched = bool(set(sa) & set(sb) & set(out) - set("."))
    y = _mixed_einsum(spec, a.astype(dtype), b.astype(dtype))
    return checkpoint_name(y, BATCHED_MATMUL if batched else MATMUL)


TOKEN_MATMUL = "tk,kn->tn"


def weight_grad(a: jax.Array, g: jax.Array) -> jax.Array:
    """Σ_t a[t]ᵀ g[t]: a [..., K], g [..., N] (same dtype) → [K, N] fp32, the weight gradient of `a @ w`.

    One contraction over the token axis (no copy: fp32 runs best so on XLA:CPU, benchmarks/README.md, "Flat token
    axis"; bf16 on XLA:CPU reads aᵀ from a forward-layout copy, `gemm_layout_einsum`). Several leading axes (see
    `flat_tokens_are_local`) contract as they are."""
    if a.ndim > 2:
        return jnp.einsum("...k,...n->kn", a, g, preferred_element_type=jnp.float32)
    return _einsum_f32("tk,tn->kn", a, g)


def as_bits(x: jax.Array) -> jax.Array:
    """bf16 on XLA:CPU as its uint16 bit pattern (anything else unchanged), for a buffer written or stacked
    piecewise: XLA:CPU performs a bf16 dynamic-update-slice in fp32 on a converted copy of the whole buffer
    (the layer scan's stacked residuals: an fp32 copy of every layer's, converted back slice by slice in the
    backward loop); on integer bits the updates stay in place. `from_bits` undoes it."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if _bf16_on_cpu(x) else x


def from_bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x


def _bf16_on_cpu(x: jax.Array) -> bool:
    return x.dtype == jnp.bfloat16 and jax.default_backend() == "cpu"


def mm(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """`x @ w` as `einsum`: x [..., K], w [K, N] → [..., N] fp32. Callers cast when they need `dtype`.

    Where that is a local reshape (`flat_tokens_are_local`) the leading axes are merged into one token axis
    first, so the weight gradient `xᵀ·g` contracts a single axis: with several contracting axes XLA:CPU first
    copies x into a transposed layout (≈ 19% of the 100M CPU step, benchmarks/README.md)."""
    if x.ndim == 2 or not flat_tokens_are_local():
        return einsum("...k,kn->...n", x, w, dtype)
    y = einsum(TOKEN_MATMUL, x.reshape(-1, x.shape[-1]), w, dtype)
    return y.reshape(*x.shape[:-1], w.shape[-1])


def flat_tokens_are_local() -> bool:
    """Whether merging the [batch, seq] axes of an activation into one token axis is a local reshape: without a
    mesh, inside the manual ZeRO-1 step, or under a GSPMD mesh whose sequence is not split (context axis 1).
    With the sequence split over `context`, GSPMD would gather whole sequences to merge the axes."""
    mesh = active_mesh()
    return mesh is None or in_manual_region() or mesh.shape["context"] == 1


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mixed_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return _einsum_f32(spec, a, b)


def _einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`jnp.einsum(spec, a, b)` with fp32 accumulation and result; bf16 on XLA:CPU as a GEMM in the forward
    layout (`gemm_layout_einsum`), so it runs on the fast bf16 path instead of being upcast."""
    if _bf16_on_cpu(a) and "." not in spec:
        return gemm_layout_einsum(spec, a, b)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def gemm_layout_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """`einsum(spec, a, b)` (no ellipsis) as one batched GEMM [batch, M, K] · [batch, K, N] on row-major
    operand copies, the only layout XLA:CPU's bf16 GEMM takes (`transposed`); fp32 result in `spec`'s order.

    Batch indices (in a, b and the output) and free indices keep the output's order, so for the attention and
    CCA-conv einsums only operands are permuted (a copy each where their order differs), never the result
    of those einsums' forward passes."""
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
    """x with axes `src` reordered to `dst` as a row-major copy (`permuted_copy`); x itself when in order."""
    return x if src == dst else permuted_copy(x, [src.index(c) for c in dst])


def _mixed_einsum_fwd(spec, a, b):
    return _mixed_einsum(spec, a, b), (as_bits(a), as_bits(b))


def _mixed_einsum_bwd(spec, res, g):
    """da = g·b over the indices of a, db = a·g over those of b (every index of one operand appears in the other
    or in the output: no reduction over an operand-only index, true of every einsum in this model)."""
    a, b = (from_bits(r) for r in res)
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    g = g.astype(a.dtype)
    da, db = _einsum_f32(f"{out},{sb}->{sa}", g, b), _einsum_f32(f"{sa},{out}->{sb}", a, g)
    return _like(da.astype(a.dtype), a), _like(db.astype(b.dtype), b)


def transposed(x: jax.Array) -> jax.Array:
    """xᵀ (the last two axes swapped) as a row-major copy, for an operand a GEMM must read in the forward layout.

    XLA:CPU runs a bf16 GEMM on its fast path (AMX/AVX-512 bf16) only when the lhs contracts its minor axis and
    the rhs its major axis; a transposed operand (`g·Wᵀ`, `xᵀ·g`) is otherwise upcast and runs at the fp32
    rate (benchmarks/README.md, "bf16 GEMM layouts"). Pinning both x and xᵀ to row-major layouts makes XLA
    materialise x (a cheap copy out of the layer scan's stacked residuals) and then transpose it with its fast
    transpose emitter, instead of folding the transpose into the GEMM or into the scan's dynamic slice."""
    return permuted_copy(x, [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2])


def permuted_copy(x: jax.Array, perm: list[int]) -> jax.Array:
    """`jnp.transpose(x, perm)` materialised as a row-major array from a row-major x (see `transposed`)."""
    return row_major(jnp.transpose(row_major(x), perm))


def row_major(x: jax.Array) -> jax.Array:
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


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


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


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
