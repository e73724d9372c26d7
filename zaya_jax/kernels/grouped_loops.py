"""The `loops` grouped-GEMM kernel (XLA:CPU): tokens sorted by expert, per-expert loops over row chunks.

XLA:CPU lowers `jax.lax.ragged_dot` to one dense masked dot (E× the expert FLOPs) and the capacity
dispatch does cf× the work and drops overflow. Here the tokens of expert e occupy rows
[start_e, start_e + n_e) of a sorted buffer; a loop over the experts that have tokens slices W_e once,
runs the rest of its rows (n_e mod BIG, rounded up to a multiple of SMALL) as one chunk whose size a
`lax.switch` picks among SMALL, 2·SMALL, …, BIG, then ⌊n_e / BIG⌋ chunks of BIG rows. So a group of ≤ BIG
rows is one call of each GEMM, the waste is < SMALL rows per expert, an idle expert costs nothing, and the
work is ≈ the active FLOPs whatever the load balance (dynamic trip counts).

The backward pass is written by hand (`jax.custom_vjp`; JAX cannot differentiate loops with dynamic
trip counts) with the same loop structure; gate/up activations are kept from the forward pass.
Chunks write whole blocks (the rest chunk BIG rows, zero-padded, written outside the switch so that XLA
does not copy the buffers into its branches): rows past the group are masked to zero, and because experts
run in increasing order a later expert overwrites them with its own result. bf16 buffers written piecewise and
residuals are kept as bits, backward operands in the forward layout (`zaya_jax.kernels.xla_cpu`). On GPUs use
`ragged_dot` (docs/kernels.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from zaya_jax.kernels.xla_cpu import as_bits, from_bits, transposed

SMALL, BIG = 16, 256  # row granularity (waste < SMALL rows per expert) and the largest chunk
PAD = BIG  # zero rows after the last group: the rest chunk writes a whole block of BIG rows


def _rest(n: jax.Array, outputs):
    """Rows [BIG·⌊n/BIG⌋, n) of a group as one chunk of the smallest multiple of SMALL that covers them, by
    `lax.switch` among the static sizes SMALL, 2·SMALL, …, BIG: one call of each GEMM for a group of ≤ BIG
    rows, < SMALL rows of waste. With no rest it runs SMALL rows past the group, which the callers mask.

    outputs(size, row) → (blocks, other): `blocks` [size, ...] arrays, row-aligned with the chunk, come back
    zero-padded to BIG rows; `other` as is. Returns (row, blocks, other). The caller writes the blocks: a
    buffer updated inside a branch would be copied whole into every branch.
    """
    row = n // BIG * BIG

    def branch(size):
        blocks, other = outputs(size, row)
        return tuple(jnp.pad(b, ((0, BIG - size), (0, 0))) for b in blocks), other

    sizes = range(SMALL, BIG + 1, SMALL)
    blocks, other = jax.lax.switch(
        (jnp.maximum(n - row, 1) - 1) // SMALL, [functools.partial(branch, s) for s in sizes]
    )
    return row, blocks, other


def _nonempty(sizes: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(expert ids with rows first, in increasing order, then the empty ones; how many have rows): the expert
    loops visit only those, so an idle expert costs no weight copy, GEMM or write."""
    return jnp.argsort(sizes == 0, stable=True).astype(jnp.int32), jnp.sum(sizes > 0)


def _write(buffers: tuple, blocks: tuple, at: jax.Array) -> tuple:
    """Each block written into its buffer from row `at`."""
    return tuple(jax.lax.dynamic_update_slice(b, k.astype(b.dtype), (at, 0)) for b, k in zip(buffers, blocks))


def _silu_parts(g: jax.Array) -> tuple[jax.Array, jax.Array]:
    s = jax.nn.sigmoid(g)
    return g * s, s


def _mm(a: jax.Array, b: jax.Array, dt) -> jax.Array:
    """a @ b with `dt` operands and fp32 accumulation."""
    return jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32)


def _expert(w: jax.Array, layer: jax.Array, e: jax.Array) -> jax.Array:
    """w[layer, e] of a layer-stacked expert weight [L, E, ...]: one slice (a copy on XLA:CPU) of one expert."""
    return jax.lax.dynamic_slice(w, (layer, e, *(0,) * (w.ndim - 2)), (1, 1, *w.shape[2:]))[0, 0]


def _forward(xs, starts, sizes, w_in, w_out, layer):
    """xs [Tp, H] sorted (Tp ≥ T + PAD), starts/sizes [E] → (ys [Tp, H] fp32, gate_up [Tp, 2I] in xs.dtype, as
    `xla_cpu.as_bits`)."""
    h, two_i, dt = w_in.shape[2], w_in.shape[3], xs.dtype
    ys = jnp.zeros(xs.shape, jnp.float32)
    gu_all = as_bits(jnp.zeros((xs.shape[0], two_i), dt))

    ids, busy = _nonempty(sizes)

    def expert(k, carry):
        e = ids[k]
        wi, wo = _expert(w_in, layer, e).astype(dt), _expert(w_out, layer, e).astype(dt)
        start, n = starts[e], sizes[e]

        def outputs(size, row):
            """(y masked to the group's rows, gate_up as bits) of rows [row, row + size) of the group."""
            x = jax.lax.dynamic_slice(xs, (start + row, 0), (size, h))
            gu = _mm(x, wi, dt)
            g, u = jnp.split(gu, 2, axis=-1)
            y = _mm(_silu_parts(g)[0] * u, wo, dt)
            valid = (row + jnp.arange(size) < n)[:, None]
            return (jnp.where(valid, y, 0), as_bits(gu.astype(dt))), ()

        row, blocks, _ = _rest(n, outputs)
        carry = _write(carry, blocks, start + row)
        full = lambda j, c: _write(c, outputs(BIG, j * BIG)[0], start + j * BIG)  # noqa: E731
        return jax.lax.fori_loop(0, n // BIG, full, carry)

    return jax.lax.fori_loop(0, busy, expert, (ys, gu_all))


@jax.custom_vjp
def grouped_swiglu(
    xs: jax.Array, starts: jax.Array, sizes: jax.Array, w_in: jax.Array, w_out: jax.Array, layer: jax.Array
) -> jax.Array:
    """Per-expert SwiGLU on an expert-sorted buffer, with the experts of layer `layer` of layer-stacked weights.

    xs: [Tp, H] rows sorted by expert, with at least PAD zero rows of padding after the last group;
    starts, sizes: [E] int32 (rows of expert e: [starts[e], starts[e] + sizes[e])); w_in: [L, E, H, 2I]
    (gate | up); w_out: [L, E, I, H], any dtype (the weight gradients come back in it); layer: [] int32.
    Returns ys [Tp, H] fp32: expert outputs, 0 on rows of no group. Operands of every GEMM are in xs.dtype
    (the compute dtype), accumulation in fp32.

    Taking the whole stacks lets the layer scan pass its weights in unsliced: each expert's matrix is then
    copied once (XLA:CPU feeds a GEMM only from a buffer of its own) instead of the layer's slice first, and
    the weight gradient, zero outside layer `layer`, becomes an in-place update of the scan's accumulator.
    """
    return _forward(xs, starts, sizes, w_in, w_out, layer)[0]


def _t(a: jax.Array, dt) -> jax.Array:
    """aᵀ for a backward GEMM operand: a row-major copy in bf16 (XLA:CPU's fast bf16 GEMMs need the forward
    layout, see `transposed`), a plain transpose in fp32 (which runs at full rate either way)."""
    return transposed(a.astype(dt)) if dt == jnp.bfloat16 else a.T


def _fwd(xs, starts, sizes, w_in, w_out, layer):
    # bf16 residuals as bits: the layer scan stacks them, and XLA:CPU would stack bf16 through fp32 copies
    ys, gu_bits = _forward(xs, starts, sizes, w_in, w_out, layer)
    return ys, (as_bits(xs), gu_bits, starts, sizes, w_in, w_out, layer)


def _bwd(res, dys):
    xs_bits, gu_bits, starts, sizes, w_in, w_out, layer = res
    xs, gu_all = from_bits(xs_bits), from_bits(gu_bits)
    h, two_i, dt = w_in.shape[2], w_in.shape[3], xs.dtype
    bf16 = dt == jnp.bfloat16

    ids, busy = _nonempty(sizes)

    def expert(k, carry):
        dxs, dw_in, dw_out = carry
        e = ids[k]
        start, n = starts[e], sizes[e]
        wi, wo = _expert(w_in, layer, e), _expert(w_out, layer, e)
        # W_inᵀ [2I, H], W_outᵀ [H, I]: in bf16 forward-layout copies made once per expert (fused with the slice
        # and the cast); in fp32 transposed inside the chunk loop, where XLA folds the transpose into the GEMM
        # (a copy hoisted out of the loop would be a slow strided one)
        wi_t, wo_t = (_t(wi, dt), _t(wo, dt)) if bf16 else (None, None)

        def outputs(size, row):
            """(input gradient as bits,), (W_in, W_out gradients in fp32) of rows [row, row + size) of the group."""
            at = (start + row, 0)
            valid = (row + jnp.arange(size) < n)[:, None]
            x = jax.lax.dynamic_slice(xs, at, (size, h))
            gu = jax.lax.dynamic_slice(gu_all, at, (size, two_i)).astype(jnp.float32)
            g, u = jnp.split(gu, 2, axis=-1)
            dy = jnp.where(valid, jax.lax.dynamic_slice(dys, at, (size, h)), 0)
            act, sig = _silu_parts(g)
            dwo = _mm(_t(act * u, dt), dy, dt)
            da = _mm(dy, wo_t if bf16 else wo.T, dt)
            dgu = jnp.concatenate([da * u * (sig * (1 + g * (1 - sig))), da * act], axis=-1)
            dwi = _mm(_t(x, dt), dgu, dt)
            dx = _mm(dgu, wi_t if bf16 else wi.T, dt)
            return (as_bits(dx.astype(dt)),), (dwi, dwo)

        def full(j, c):
            dxs, acc_in, acc_out = c
            blocks, (dwi, dwo) = outputs(BIG, j * BIG)
            return (*_write((dxs,), blocks, start + j * BIG), acc_in + dwi, acc_out + dwo)

        # the rest chunk first: its products start the weight-gradient sums (no zero fill, no add)
        row, blocks, dws = _rest(n, outputs)
        acc = jax.lax.fori_loop(0, n // BIG, full, (*_write((dxs,), blocks, start + row), *dws))
        dxs, acc_in, acc_out = acc
        dw_in, dw_out = (
            jax.lax.dynamic_update_index_in_dim(b, a.astype(b.dtype), e, 0)
            for b, a in ((dw_in, acc_in), (dw_out, acc_out))
        )
        return dxs, dw_in, dw_out

    stacks = (jnp.zeros(w.shape[1:], w.dtype) for w in (w_in, w_out))  # [E, ...]: idle experts' stay zero
    dxs, *dws = jax.lax.fori_loop(0, busy, expert, (as_bits(jnp.zeros_like(xs)), *stacks))
    # zero but for layer `layer`: under the layer scan's transpose, XLA turns "accumulator + this" into an
    # in-place update of that layer's slice
    dw_in, dw_out = (
        jax.lax.dynamic_update_slice(jnp.zeros_like(w), dw[None], (layer, *(0,) * (w.ndim - 1)))
        for w, dw in zip((w_in, w_out), dws)
    )
    return from_bits(dxs), None, None, dw_in, dw_out, None


grouped_swiglu.defvjp(_fwd, _bwd)


def grouped_local(
    x: jax.Array, choice: jax.Array, gate: jax.Array, w_in: jax.Array, w_out: jax.Array, layer: jax.Array | None = None
) -> jax.Array:
    """x [T, H], choice [T] in [0, E] (E = skip), gate [T] → g · expert(x) [T, H] fp32 (0 for skip tokens).

    w_in [E, H, 2I], w_out [E, I, H]; or, with `layer` ([] int32), the layer-stacked [L, E, ...] weights of
    the whole decoder (see `grouped_swiglu`)."""
    if layer is None:
        w_in, w_out, layer = w_in[None], w_out[None], jnp.zeros((), jnp.int32)
    t, h = x.shape
    num_experts = w_in.shape[1]
    order = jnp.argsort(choice, stable=True)  # skip tokens sort last
    sizes = jnp.bincount(choice, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    starts = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
    xs = jnp.concatenate([x[order], jnp.zeros((PAD, h), x.dtype)], axis=0)
    ys = grouped_swiglu(xs, starts, sizes, w_in, w_out, layer)[:t]
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(t, dtype=order.dtype))
    return ys[inverse] * gate[:, None]
