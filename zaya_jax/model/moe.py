"""Top-1 mixture of SwiGLU experts with the ZAYA1 skip slot (§7).

Every dispatch implementation has the same signature (see `Dispatch`) and computes, for the
expert tokens it keeps, `g · out_{e*}(x)`; skip-slot tokens (choice == E) and dropped tokens give 0.
The skip-slot output (`scaled_input` → g·x, `zero` → 0) is added by `MoE` itself, so it is the same
for every dispatch.

* `dense`: one-hot reference, runs every expert on every token (E× the FLOPs; tests only).
* `ragged`: dropless, sort by expert + `jax.lax.ragged_dot` (grouped GEMM on GPU; masked dense on CPU).
* `capacity`: gather into fixed-capacity buffers [E, C, H] + batched GEMM (fast on CPU; drops overflow).
* `ep`: expert parallelism over the `expert` mesh axis with `all_to_all` (`zaya_jax.parallel.expert_parallel`).
* `grouped`: dropless, sort by expert + per-expert loops of chunked GEMMs (`zaya_jax.model.grouped`): ≈ the
  active FLOPs on CPU, exact; under a mesh each device sorts its own tokens (weights replicated).
* `auto` (default): `ep` under an active data/context/expert mesh whose expert axis is > 1 (each device computes
  only its tokens for its experts; under plain GSPMD the gather-based dispatches replicate expert work); on
  CPU otherwise `grouped`; on accelerators otherwise `ep` under a mesh, else `ragged` (dropless, exact).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.model import layers
from zaya_jax.model.router import Router
from zaya_jax.parallel import sharding


class DispatchResult(NamedTuple):
    out: jax.Array  # [T, H] gate-weighted expert output (0 for skip / dropped tokens)
    dropped: jax.Array  # [] int32 number of expert tokens dropped by a capacity limit


# (x [T, H], choice [T] int32 in [0, E], gate [T] fp32, w_in [E, H, 2I], w_out [E, I, H], cfg) -> DispatchResult
Dispatch = Callable[..., DispatchResult]


def swiglu(x: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
    """Batched expert MLP. x: [E, C, H], w_in: [E, H, 2I] (gate | up), w_out: [E, I, H] → [E, C, H]."""
    gate_up = jnp.einsum("ech,ehf->ecf", x, w_in)
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return jnp.einsum("eci,eih->ech", jax.nn.silu(gate) * up, w_out)


def dense_dispatch(x, choice, gate, w_in, w_out, cfg) -> DispatchResult:
    """Reference: all experts on all tokens, combined with one-hot(choice) · g."""
    num_experts = w_in.shape[0]
    outs = swiglu(jnp.broadcast_to(x, (num_experts, *x.shape)), w_in, w_out)  # [E, T, H]
    weights = jax.nn.one_hot(choice, num_experts, dtype=x.dtype) * gate[:, None].astype(x.dtype)  # skip → 0
    return DispatchResult(jnp.einsum("te,eth->th", weights, outs), jnp.zeros((), jnp.int32))


def ragged_dispatch(x, choice, gate, w_in, w_out, cfg) -> DispatchResult:
    """Dropless: stable sort by expert (skip tokens sort last), grouped GEMMs, unsort, scale by g."""
    num_experts = w_in.shape[0]
    order = jnp.argsort(choice, stable=True)
    sizes = jnp.bincount(choice, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    xs = x[order]
    gate_up = jax.lax.ragged_dot(xs, w_in, sizes, preferred_element_type=jnp.float32).astype(x.dtype)
    g_, up = jnp.split(gate_up, 2, axis=-1)
    ys = jax.lax.ragged_dot(jax.nn.silu(g_) * up, w_out, sizes, preferred_element_type=jnp.float32)
    valid = jnp.arange(x.shape[0]) < jnp.sum(sizes)  # rows past the groups (skip tokens) are unspecified
    ys = jnp.where(valid[:, None], ys, 0.0).astype(x.dtype)
    out = jnp.zeros_like(ys).at[order].set(ys)
    return DispatchResult(out * gate[:, None].astype(x.dtype), jnp.zeros((), jnp.int32))


def capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(cf · T / E), at least 1 and at most T (cf ≥ E is dropless)."""
    return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens / num_experts)))


def slot_positions(choice: jax.Array, num_experts: int) -> jax.Array:
    """Position of each token among the tokens routed to the same expert, in token order. [T] int32."""
    onehot = jax.nn.one_hot(choice, num_experts + 1, dtype=jnp.int32)
    return jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1, choice[:, None], axis=1)[:, 0]


def capacity_dispatch(x, choice, gate, w_in, w_out, cfg) -> DispatchResult:
    """Fixed-capacity buffers: token t goes to slot (e*, pos) if pos < C; overflow is dropped."""
    num_experts, (t, h) = w_in.shape[0], x.shape
    cap = capacity(t, num_experts, cfg.capacity_factor)
    pos = slot_positions(choice, num_experts)
    is_expert = choice < num_experts
    keep = is_expert & (pos < cap)
    slot = jnp.where(keep, choice * cap + pos, num_experts * cap)  # last row = trash slot
    buf = jnp.zeros((num_experts * cap + 1, h), x.dtype).at[slot].set(x)
    ybuf = swiglu(buf[:-1].reshape(num_experts, cap, h), w_in, w_out).reshape(num_experts * cap, h)
    ybuf = jnp.concatenate([ybuf, jnp.zeros((1, h), ybuf.dtype)], axis=0)
    out = ybuf[slot] * gate[:, None].astype(x.dtype)
    return DispatchResult(out, jnp.sum(is_expert & ~keep).astype(jnp.int32))


def grouped_dispatch(x, choice, gate, w_in, w_out, cfg) -> DispatchResult:
    """Dropless per-expert chunked GEMMs on expert-sorted tokens (`zaya_jax.model.grouped`); per device under
    a data/context/expert mesh (`shard_map` over the token axes, expert weights replicated)."""
    from zaya_jax.model.grouped import grouped_local
    from zaya_jax.parallel.expert_parallel import TOKEN_AXES
    from zaya_jax.parallel.mesh import AXES

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names) or mesh.size == 1:  # 1 device: no shard_map (its
        out = grouped_local(x, choice, gate, w_in, w_out)                      # transpose adds an all-reduce)
    else:
        tokens = jax.sharding.PartitionSpec(TOKEN_AXES)
        none = jax.sharding.PartitionSpec()
        out = jax.shard_map(grouped_local, mesh=mesh, in_specs=(tokens, tokens, tokens, none, none),
                            out_specs=tokens, check_vma=False)(x, choice, gate, w_in, w_out)
    return DispatchResult(out, jnp.zeros((), jnp.int32))


def resolve_dispatch(name: str) -> str:
    """The concrete dispatch for `name` at trace time (`auto` looks at the active mesh and the backend)."""
    if name != "auto":
        return name
    from zaya_jax.parallel.mesh import AXES

    mesh = jax.sharding.get_abstract_mesh()
    meshed = not mesh.empty and set(AXES) <= set(mesh.axis_names)
    if meshed and mesh.shape["expert"] > 1:
        return "ep"
    if jax.default_backend() == "cpu":
        return "grouped"
    return "ep" if meshed else "ragged"


def get_dispatch(name: str) -> Dispatch:
    name = resolve_dispatch(name)
    if name == "ep":
        from zaya_jax.parallel.expert_parallel import ep_dispatch

        return ep_dispatch
    return {"dense": dense_dispatch, "ragged": ragged_dispatch, "capacity": capacity_dispatch,
            "grouped": grouped_dispatch}[name]


class MoEStats(NamedTuple):
    counts: jax.Array  # [E+1] int32 router choices (before any capacity drop); slot E = skip
    dropped: jax.Array  # [] int32 expert tokens dropped by capacity


class MoE(nnx.Module):
    """Router + experts of one MoE sub-layer. Expert weights: w_in [E, H, 2I] (gate | up), w_out [E, I, H]."""

    def __init__(self, m: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        pd, std = layers.dtype_of(m.param_dtype), m.initializer_range
        e, h, i = m.num_experts, m.hidden_size, m.moe_intermediate_size
        self.cfg = m
        self.router = Router(m, rngs=rngs)
        self.w_in = layers.normal_param(rngs, (e, h, 2 * i), std, pd)
        self.w_out = layers.normal_param(rngs, (e, i, h), std, pd)

    def __call__(self, x: jax.Array, state_prev: jax.Array):
        """x: [B, S, H] normed input, state_prev: [B, S, R] → (out [B, S, H], state [B, S, R], MoEStats)."""
        m, dt = self.cfg, layers.dtype_of(self.cfg.dtype)
        routing = self.router(x, state_prev)
        b, s, h = x.shape
        flat_x, choice, gate = (sharding.flatten_tokens(a) for a in (x, routing.choice, routing.gate))
        result = get_dispatch(m.dispatch)(flat_x, choice, gate, self.w_in[...].astype(dt),
                                          self.w_out[...].astype(dt), m)
        out = result.out
        if m.skip_output == "scaled_input":
            is_skip = (choice == m.num_experts)[:, None]
            out = out + jnp.where(is_skip, gate[:, None].astype(dt) * flat_x, 0).astype(out.dtype)
        counts = jnp.bincount(choice, length=m.num_experts + 1).astype(jnp.int32)
        return sharding.unflatten_tokens(out, b, s), routing.state, MoEStats(counts, result.dropped)
