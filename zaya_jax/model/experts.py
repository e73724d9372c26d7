"""Expert math shared by every MoE dispatch (§7): the batched SwiGLU, the gate, and fixed-capacity slots.

`capacity_dispatch` (one device) and expert parallelism (`zaya_jax.model.expert_parallel`, over the `expert`
mesh axis) both pack tokens into per-expert slots with `capacity_slots` / `pack_slots` / `unpack_slots`.
Every matmul takes compute-dtype operands and accumulates in fp32.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from zaya_jax.kernels import Kernels


class DispatchResult(NamedTuple):
    out: jax.Array  # [T, H] fp32 gate-weighted expert output (0 for skip / dropped tokens)
    dropped: jax.Array  # [] int32 number of expert tokens dropped by a capacity limit


# (x [T, H], choice [T] int32 in [0, E], gate [T] fp32, experts: kernels.ExpertWeights, cfg, kernels: Kernels)
#   -> DispatchResult
Dispatch = Callable[..., DispatchResult]


def swiglu(x: jax.Array, w_in: jax.Array, w_out: jax.Array, kernels: Kernels) -> jax.Array:
    """Batched expert MLP, operands in x's dtype, fp32 accumulation.

    x: [E, C, H], w_in: [E, H, 2I] (gate | up), w_out: [E, I, H] → [E, C, H] fp32.
    """
    dt = x.dtype
    with jax.named_scope("experts"):  # names the expert GEMMs in compiled HLO (zaya_jax.planning.gpu_program)
        gate_up = kernels.einsum("ech,ehf->ecf", x, w_in, dt)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        return kernels.einsum("eci,eih->ech", jax.nn.silu(gate) * up, w_out, dt)


def gated(y: jax.Array, choice: jax.Array, gate: jax.Array, num_experts: int) -> jax.Array:
    """g · y for expert tokens, 0 for skip tokens. y: [T, H], choice/gate: [T] → [T, H] fp32."""
    return jnp.where((choice < num_experts)[:, None], y.astype(jnp.float32) * gate[:, None], 0.0)


def capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(cf · T / E), at least 1 and at most T (cf ≥ E is dropless)."""
    return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens / num_experts)))


def slot_positions(choice: jax.Array, num_experts: int) -> jax.Array:
    """Position of each token among the tokens routed to the same expert, in token order. [T] int32."""
    onehot = jax.nn.one_hot(choice, num_experts + 1, dtype=jnp.int32)
    return jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1, choice[:, None], axis=1)[:, 0]


class CapacitySlots(NamedTuple):
    """Where each token goes in fixed-capacity expert buffers [E·C (+1 trash row), H]."""

    slot: jax.Array  # [T] int32: e*·C + pos for kept expert tokens, E·C (the trash row) otherwise
    dropped: jax.Array  # [] int32 expert tokens beyond their expert's capacity


def capacity_slots(choice: jax.Array, num_experts: int, cap: int) -> CapacitySlots:
    """Token t (routed to e*, the pos-th such token in token order) takes slot (e*, pos) if pos < C."""
    pos = slot_positions(choice, num_experts)
    is_expert = choice < num_experts
    keep = is_expert & (pos < cap)
    return CapacitySlots(
        jnp.where(keep, choice * cap + pos, num_experts * cap), jnp.sum(is_expert & ~keep).astype(jnp.int32)
    )


def pack_slots(x: jax.Array, slots: CapacitySlots, rows: int) -> jax.Array:
    """x [T, H] → buffer [rows, H] (rows = E·C) with each kept token in its slot, zeros elsewhere."""
    return jnp.zeros((rows + 1, x.shape[1]), x.dtype).at[slots.slot].set(x)[:-1]


def unpack_slots(buf: jax.Array, slots: CapacitySlots) -> jax.Array:
    """Expert outputs [E·C, H] → [T, H] in token order (0 for dropped and skip tokens)."""
    return jnp.concatenate([buf, jnp.zeros((1, buf.shape[1]), buf.dtype)], axis=0)[slots.slot]
