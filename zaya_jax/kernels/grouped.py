"""Dropless expert SwiGLU on one device's tokens: the grouped expert GEMMs of the MoE (docs/architecture.md §7,
docs/kernels.md). Tokens are sorted by expert, each expert's rows run through its own W_in / W_out, and the
results go back to token order times the gate.

Four implementations (`model.kernels.grouped_gemm`), all computing exactly the active FLOPs' result:

* `loops`: per-expert loops of chunked GEMMs (`zaya_jax.kernels.grouped_loops`), XLA:CPU's fast path (XLA:CPU
  lowers `ragged_dot` to one dense masked dot, E× the work). It can read the whole [L, E, ...] expert stacks of
  the decoder (`ExpertWeights.layer`), so the layer scan hands them over unsliced.
* `ragged_dot`: `jax.lax.ragged_dot` with fp32 results, lowered by XLA for the platform: on ROCm dense hipBLASLt
  GEMMs over all experts (`--xla_gpu_experimental_use_ragged_dot_grouped_gemm` of launch/rocm/env.sh takes bf16
  results only), on CUDA XLA's default lowering.
* `ragged_dot_bf16`: the same with its result in the compute dtype (`model.dtype`: bf16 in the GPU configs), fp32
  accumulation inside the GEMM; the backward's GEMMs (input and weight gradients) take and give the compute
  dtype too. This is what XLA lowers to hipBLASLt's grouped GEMM on ROCm, forward and backward (the `auto`
  choice there, `zaya_jax.kernels.choice`); weight gradients reach the fp32 parameters through the cast's
  transpose, and micro-batches still accumulate them in fp32.
* `tokamax`: `tokamax.ragged_dot` (Pallas kernels; same API), when the `tokamax` package is installed (CUDA's
  `auto` with tokamax >= 0.0.17, `zaya_jax.kernels.choice`); results in the compute dtype like `ragged_dot_bf16`
  (its Mosaic GPU backward needs the cotangent in the operands' dtype). Its input gradient multiplies by a transposed
  copy of the layer's weights made by `zaya_jax.kernels.transpose`, so XLA cannot turn tokamax's own transpose
  into a transposed copy of the whole [L, E, ...] stack (docs/kernels.md).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zaya_jax.kernels.grouped_loops import grouped_local
from zaya_jax.kernels.transpose import transposed


class ExpertWeights(NamedTuple):
    """One MoE layer's expert weights: w_in [E, H, 2I] (gate | up), w_out [E, I, H]; or, with `layer` ([] int32),
    the decoder's layer-stacked [L, E, ...] weights and the index of this layer."""

    w_in: jax.Array
    w_out: jax.Array
    layer: jax.Array | None = None

    def of_layer(self) -> tuple[jax.Array, jax.Array]:
        """(w_in [E, H, 2I], w_out [E, I, H]) of this layer."""
        if self.layer is None:
            return self.w_in, self.w_out
        return tuple(jax.lax.dynamic_index_in_dim(w, self.layer, 0, keepdims=False) for w in (self.w_in, self.w_out))


def dropless_swiglu(
    kernel: str, x: jax.Array, choice: jax.Array, gate: jax.Array, experts: ExpertWeights, platform: str = "cpu"
):
    """x [T, H] (compute dtype), choice [T] in [0, E] (E = skip), gate [T] → g · expert(x) [T, H] fp32, 0 for skip
    tokens. GEMM operands in x's dtype, fp32 accumulation; weight gradients come back in the weights' dtype."""
    if kernel == "loops":
        return grouped_local(x, choice, gate, *experts)
    w_in, w_out = experts.of_layer()
    result = x.dtype if kernel in ("ragged_dot_bf16", "tokamax") else jnp.float32
    return _ragged_local(_ragged_dot_of(kernel, platform), x, choice, gate, w_in, w_out, result)


def _ragged_dot_of(kernel: str, platform: str):
    if kernel in ("ragged_dot", "ragged_dot_bf16"):
        return jax.lax.ragged_dot
    if kernel == "tokamax":
        try:
            import tokamax  # optional: a GPU kernel library, installed with the `cuda` / `gpu-compile` / `test` extras
        except ImportError as e:
            raise RuntimeError(
                "model.kernels.grouped_gemm=tokamax needs the tokamax package: pip install 'tokamax>=0.0.17' "
                "(or choose model.kernels.grouped_gemm=ragged_dot)"
            ) from e
        return partial(_weights_transposed_per_layer, tokamax.ragged_dot, platform)
    raise ValueError(f"unknown grouped-GEMM kernel {kernel!r}")


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 5))
def _weights_transposed_per_layer(ragged_dot, platform, lhs, rhs, sizes, preferred_element_type):
    """`ragged_dot(lhs [M, K], rhs [E, K, N], sizes)` whose input gradient multiplies by a transposed copy of this
    layer's `rhs` made by `kernels.transpose` (tokamax's own transposes it with `mT`, and XLA turned that into a
    transposed copy of the whole [L, E, K, N] stack: ZAYA1-base at data:8 on H100 peaked at 97 GB)."""
    return ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred_element_type)


def _transposed_fwd(ragged_dot, platform, lhs, rhs, sizes, preferred_element_type):
    out = ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred_element_type)
    return out, (lhs, rhs, sizes)


def _transposed_bwd(ragged_dot, platform, preferred_element_type, res, dy):
    lhs, rhs, sizes = res
    dy = dy.astype(lhs.dtype)  # tokamax's Mosaic GPU kernels take operands of one dtype
    _, rhs_vjp = jax.vjp(lambda w: ragged_dot(lhs, w, sizes, preferred_element_type=lhs.dtype), rhs)
    (d_rhs,) = rhs_vjp(dy)  # its input-gradient half is dead code
    d_lhs = ragged_dot(dy, transposed(rhs, platform), sizes, preferred_element_type=lhs.dtype)
    return d_lhs, d_rhs.astype(rhs.dtype), None


_weights_transposed_per_layer.defvjp(_transposed_fwd, _transposed_bwd)


def _ragged_local(ragged_dot, x, choice, gate, w_in, w_out, result) -> jax.Array:
    """Stable sort by expert (skip tokens last), two grouped GEMMs with `result`-dtype outputs (the SwiGLU and
    the gate in fp32), unsort."""
    num_experts, dt = w_in.shape[0], x.dtype
    order = jnp.argsort(choice, stable=True)
    sizes = jnp.bincount(choice, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    gate_up = ragged_dot(x[order], w_in.astype(dt), sizes, preferred_element_type=result).astype(jnp.float32)
    g, up = jnp.split(gate_up, 2, axis=-1)
    act = (jax.nn.silu(g) * up).astype(dt)
    ys = ragged_dot(act, w_out.astype(dt), sizes, preferred_element_type=result).astype(jnp.float32)
    valid = jnp.arange(x.shape[0]) < jnp.sum(sizes)  # rows past the groups (skip tokens) are unspecified
    ys = jnp.where(valid[:, None], ys, 0.0)
    expert_token = (choice < num_experts)[:, None]
    return jnp.where(expert_token, jnp.zeros_like(ys).at[order].set(ys) * gate[:, None], 0.0)
