"""Top-1 mixture of SwiGLU experts with the ZAYA1 skip slot (§7).

Every dispatch implementation has the same signature (see `Dispatch`) and computes, for the
expert tokens it keeps, `g · out_{e*}(x)`; skip-slot tokens (choice == E) and dropped tokens give 0.
The skip-slot output (`scaled_input` → g·x, `zero` → 0) is added by `MoE` itself, so it is the same
for every dispatch.

* `dense`: reference, runs every expert on every token (E× the FLOPs; tests only).
* `dropless`: per device, every token to its expert: the grouped expert GEMMs of `model.kernels.grouped_gemm`
  (`zaya_jax.kernels.grouped`: per-expert loops on CPU, `ragged_dot` on GPUs), exact.
* `capacity`: gather into fixed-capacity buffers [E, C, H] + batched GEMM (drops overflow, counted).
* `ep`: expert parallelism over the `expert` mesh axis with a fixed-capacity `all_to_all`
  (`zaya_jax.model.expert_parallel`; drops overflow, counted).
* `ep_ragged`: expert parallelism with a ragged all-to-all into one receive buffer of cf · T_l rows per device
  and the grouped expert GEMMs over the rows received (`zaya_jax.model.expert_parallel`; dropless for
  cf ≥ the expert axis, else drops what overflows a device's buffer, counted).
* `auto` (default): `ep` when the active mesh has an expert axis > 1, otherwise `dropless`.

The dropless dispatches, those that never drop a token on any layout, are `config.defaults.DROPLESS_DISPATCHES`
(`dropless`, `dense`); `auto` drops only where it resolves to `ep`.

Every matmul takes compute-dtype operands and accumulates in fp32; dispatch outputs are fp32 (they feed
the fp32 residual stream, §9).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.config import CONCRETE_DISPATCHES, choice_table
from zaya_jax.kernels import ExpertWeights, Kernels
from zaya_jax.model import layers
from zaya_jax.model.expert_parallel import ep_dispatch, ep_ragged_dispatch
from zaya_jax.model.experts import (
    Dispatch,
    DispatchResult,
    capacity,
    capacity_slots,
    gated,
    pack_slots,
    swiglu,
    unpack_slots,
)
from zaya_jax.model.router import Router
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import active_mesh, in_manual_region


def dense_dispatch(x, choice, gate, experts: ExpertWeights, cfg, kernels: Kernels) -> DispatchResult:
    """Reference: all experts on all tokens, then each token takes its expert's row."""
    w_in, w_out = experts.of_layer()
    num_experts = w_in.shape[0]
    outs = swiglu(jnp.broadcast_to(x, (num_experts, *x.shape)), w_in, w_out, kernels)  # [E, T, H]
    mine = jnp.take_along_axis(outs, jnp.minimum(choice, num_experts - 1)[None, :, None], axis=0)[0]
    return DispatchResult(gated(mine, choice, gate, num_experts), jnp.zeros((), jnp.int32))


def capacity_dispatch(x, choice, gate, experts: ExpertWeights, cfg, kernels: Kernels) -> DispatchResult:
    """Fixed-capacity buffers: token t goes to slot (e*, pos) if pos < C; overflow is dropped."""
    w_in, w_out = experts.of_layer()
    num_experts, (t, h) = w_in.shape[0], x.shape
    cap = capacity(t, num_experts, cfg.capacity_factor)
    slots = capacity_slots(choice, num_experts, cap)
    buf = pack_slots(x, slots, num_experts * cap).reshape(num_experts, cap, h)
    y = swiglu(buf, w_in, w_out, kernels).reshape(num_experts * cap, h)
    return DispatchResult(gated(unpack_slots(y, slots), choice, gate, num_experts), slots.dropped)


def runs_unsharded() -> bool:
    """Whether a per-device dispatch runs its body directly (no mesh, one device, or inside a manual
    `shard_map`), rather than wrapped in a `shard_map` over the token axes."""
    mesh = active_mesh()
    return mesh is None or mesh.size == 1 or in_manual_region()


def dropless_dispatch(x, choice, gate, experts: ExpertWeights, cfg, kernels: Kernels) -> DispatchResult:
    """Every token to its expert, per device: `kernels.grouped_swiglu` on this device's tokens with the full
    (replicated) expert weights. Called directly without a mesh, on one device, or inside a manual `shard_map`
    (the ZeRO-1 step); under a GSPMD mesh wrapped in a `shard_map` over the token axes."""
    if runs_unsharded():  # 1 device: no shard_map (its transpose would add an all-reduce)
        out = kernels.grouped_swiglu(x, choice, gate, experts)
    else:  # weights enter replicated: cast first, so a gather of sharded (FSDP) weights moves the compute dtype
        tokens, none = sharding.token_spec(), jax.sharding.PartitionSpec()
        w_in, w_out = (w.astype(x.dtype) for w in experts.of_layer())
        local = lambda x, c, g, wi, wo: kernels.grouped_swiglu(x, c, g, ExpertWeights(wi, wo))  # noqa: E731
        in_specs = (tokens, tokens, tokens, none, none)
        out = jax.shard_map(local, mesh=active_mesh(), in_specs=in_specs, out_specs=tokens, check_vma=False)(
            x, choice, gate, w_in, w_out
        )
    return DispatchResult(out, jnp.zeros((), jnp.int32))


def resolve_dispatch(name: str) -> str:
    """The concrete dispatch for `name` at trace time. `auto` never drops tokens unless the layout needs
    capacity: expert parallelism (`ep`, capacity-based all-to-all) only when the active mesh has an expert
    axis > 1; otherwise every device runs its own tokens `dropless`."""
    if name != "auto":
        return name
    mesh = active_mesh()
    return "ep" if mesh is not None and mesh.shape["expert"] > 1 else "dropless"


DISPATCH_TABLE = choice_table(
    CONCRETE_DISPATCHES,
    {
        "dense": dense_dispatch,
        "dropless": dropless_dispatch,
        "capacity": capacity_dispatch,
        "ep": ep_dispatch,
        "ep_ragged": ep_ragged_dispatch,
    },
)


def get_dispatch(name: str) -> Dispatch:
    """The dispatch function for `model.dispatch` (`auto` resolved for the active mesh)."""
    return DISPATCH_TABLE[resolve_dispatch(name)]


class MoEStats(NamedTuple):
    counts: jax.Array  # [E+1] int32 router choices (before any capacity drop); slot E = skip
    dropped: jax.Array  # [] int32 expert tokens dropped by capacity
    prob_sum: jax.Array  # [E+1] fp32 router probabilities summed over the tokens (the balancing warm start)
    # [E+1] fp32 Σ (p − 1/(E+1))² over the tokens: the router's spread across tokens (balancing). Centred on the
    # uniform probability so that a near-uniform router's 1e-5 spread survives fp32 (Σp² would cancel it away).
    prob_dev_sq_sum: jax.Array


EXPERT_WEIGHTS = nnx.Any(nnx.PathContains("w_in"), nnx.PathContains("w_out"))  # `MoE`'s expert weights


class MoE(nnx.Module):
    """Router + experts of one MoE sub-layer. Expert weights: w_in [E, H, 2I] (gate | up), w_out [E, I, H].
    `kernels`: the model's kernel choice (`Zaya` resolves it once and hands it down)."""

    def __init__(self, m: ml_collections.ConfigDict, kernels: Kernels, *, rngs: nnx.Rngs):
        pd, std = layers.dtype_of(m.param_dtype), m.initializer_range
        e, h, i = m.num_experts, m.hidden_size, m.moe_intermediate_size
        self.cfg = m
        self.kernels = kernels
        self.router = Router(m, kernels, rngs=rngs)
        self.w_in = layers.normal_param(rngs, (e, h, 2 * i), std, pd, ("experts", "embed", "mlp_gate_up"))
        self.w_out = layers.normal_param(rngs, (e, i, h), std, pd, ("experts", "mlp", "embed"))

    def takes_whole_stacks(self) -> bool:
        """Whether the layer scan may give this MoE its expert weights unsliced — the decoder's [L, E, ...] stacks
        plus the layer index (`kernels.ExpertWeights`) — rather than its layer's [E, ...] slice: when its tokens
        run `dropless` directly on a kernel that reads the stacks (`Kernels.takes_expert_stacks`: each expert's
        matrix is then one copy instead of two, and its weight gradient an in-place update of the scan's
        accumulator)."""
        dropless = resolve_dispatch(self.cfg.dispatch) == "dropless"
        return dropless and runs_unsharded() and self.kernels.takes_expert_stacks()

    def __call__(self, x: jax.Array, state_prev: jax.Array, layer: jax.Array | None = None):
        """x: [B, S, H] normed input, state_prev: [B, S, R] → (out [B, S, H] fp32, state [B, S, R], MoEStats).

        layer: given by the layer scan when the expert weights hold the whole [L, E, ...] stacks
        (`takes_whole_stacks`). Inside a manual `shard_map` (the ZeRO-1 step) the arrays and the counts are this
        device's."""
        m = self.cfg
        routing = self.router(x, state_prev)
        b, s, h = x.shape
        flat_x, choice, gate = (sharding.flatten_tokens(a) for a in (x, routing.choice, routing.gate))
        # the weights go in as stored: each dispatch casts its GEMM operands to x's dtype, so the weight
        # gradients come back in the parameter dtype (fp32, not rounded to bf16 and converted back)
        experts = ExpertWeights(self.w_in[...], self.w_out[...], layer)
        result = get_dispatch(m.dispatch)(flat_x, choice, gate, experts, m, self.kernels)
        out = result.out  # fp32
        if m.skip_output == "scaled_input":
            # the skip gate zeroed off skip tokens: a [T] select, whose transpose needs no [T, H] zeros
            skip_gate = jnp.where(choice == m.num_experts, gate, 0.0)
            out = out + skip_gate[:, None] * flat_x.astype(jnp.float32)
        counts = jnp.bincount(choice, length=m.num_experts + 1).astype(jnp.int32)
        probs = jax.lax.stop_gradient(routing.probs).reshape(-1, m.num_experts + 1)
        stats = MoEStats(counts, result.dropped, probs.sum(0), jnp.square(probs - 1.0 / probs.shape[-1]).sum(0))
        return sharding.unflatten_tokens(out, b, s), routing.state, stats
