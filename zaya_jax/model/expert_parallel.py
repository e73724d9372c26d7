"""Expert parallelism (EP) inside `jax.shard_map`: two dispatches over the `expert` mesh axis.

Tokens are sharded over every mesh axis (data, context, expert); routed experts are sharded over
`expert` (E_l = E / n_ep local experts per device). Expert weights are never gathered: only tokens move.

**`ep`: a fixed-capacity `all_to_all`.** Per device, with T_l local tokens:

1. pack: each local expert token goes to slot (e*, pos) of a send buffer [n_ep, E_l·C, H], where
   C = ceil(cf · T_l / E) slots per (source device, expert) and pos is its rank among the local tokens
   routed to e*; tokens with pos ≥ C are dropped (counted; they output 0, i.e. the residual passes);
2. `all_to_all` over `expert`: device j receives the rows for its experts from every peer;
3. local SwiGLU over [E_l, n_ep·C, H];
4. reverse `all_to_all`, unpack, scale by the gate g.

Skip-slot tokens use no capacity. With C ≥ T_l (cf ≥ E) nothing is dropped and the result equals the
dense reference. Every device computes and sends E·C = cf·T_l rows, however few tokens its experts got.

**`ep_ragged`: a ragged all-to-all into one receive buffer per device** (dropless up to the buffer):

1. sort the local tokens by expert; every device learns every device's per-expert counts (an `all_gather` of
   [E] int32);
2. one ragged all-to-all (`Kernels.ragged_all_to_all`) sends each peer exactly the rows of its experts into its
   receive buffer of B = ceil(cf · T_l) rows (cf = `model.capacity_factor`, at most n_ep · T_l: cf ≥ n_ep
   never drops). Rows that would land past B stay home: dropped and counted, as in `ep`. A buffer fills with
   its own device's rows first, then the next devices' in turn (`arrival_order`), each source's by local
   expert, so which sources overflow a full buffer differs from device to device;
3. the grouped expert GEMMs (`Kernels.grouped_swiglu`) over the received rows of the E_l local experts: only
   the rows received run, not B;
4. the reverse ragged all-to-all, unsort, scale by the gate.

The buffer pools the load of a device's E_l experts from all n_ep sources, which spreads far less than one
source's tokens per expert: the same drop rate needs a smaller cf than `ep` (`zaya_jax.planning.layouts`).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zaya_jax.kernels import ExpertWeights
from zaya_jax.model.experts import DispatchResult, capacity, capacity_slots, gated, pack_slots, swiglu, unpack_slots
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES, active_mesh, in_manual_region


def ep_local(x, choice, gate, w_in, w_out, *, num_experts: int, capacity_factor: float, kernels) -> DispatchResult:
    """Per-device body (inside a `shard_map` whose `expert` axis is manual). x: [T_l, H], choice/gate: [T_l],
    w_in: [E_l, H, 2I], w_out: [E_l, I, H] → (g · expert(x) [T_l, H] fp32, this device's dropped count)."""
    n_ep = jax.lax.axis_size("expert")
    e_local, (t_local, h) = w_in.shape[0], x.shape
    cap = capacity(t_local, num_experts, capacity_factor)
    slots = capacity_slots(choice, num_experts, cap)
    send = pack_slots(x, slots, num_experts * cap).reshape(n_ep, e_local * cap, h)
    recv = jax.lax.all_to_all(send, "expert", 0, 0, tiled=True)  # [n_ep (source), E_l·C, H]
    local_in = recv.reshape(n_ep, e_local, cap, h).transpose(1, 0, 2, 3).reshape(e_local, n_ep * cap, h)
    local_out = swiglu(local_in, w_in, w_out, kernels).astype(x.dtype)  # the return trip in the compute dtype
    back = local_out.reshape(e_local, n_ep, cap, h).transpose(1, 0, 2, 3).reshape(n_ep, e_local * cap, h)
    ret = jax.lax.all_to_all(back, "expert", 0, 0, tiled=True).reshape(num_experts * cap, h)  # expert order
    return DispatchResult(gated(unpack_slots(ret, slots), choice, gate, num_experts), slots.dropped)


def receive_rows(t_local: int, n_ep: int, capacity_factor: float) -> int:
    """Rows of a device's `ep_ragged` receive buffer: ceil(cf · T_l), at least 1, at most n_ep · T_l (dropless)."""
    return max(1, min(n_ep * t_local, math.ceil(capacity_factor * t_local)))


def _exclusive_cumsum(x, axis: int):
    return jnp.cumsum(x, axis=axis) - x


def arrival_order(n: int):
    """[dest, i] → the source whose rows come i-th into dest's buffer: dest's own first, then dest + 1, … (mod n),
    so the sources whose rows overflow a full buffer differ from destination to destination. [n, n] int32."""
    return (jnp.arange(n)[:, None] + jnp.arange(n)[None, :]) % n


def fit_receive_buffer(counts, rows: int):
    """counts [source, dest, E_l] rows each source sends each destination per local expert → (the rows that fit
    each destination's buffer of `rows`, where each (source, dest) chunk starts in dest's buffer), both
    [source, dest, ...] int32. A buffer fills in `arrival_order`, each source's rows in local-expert order."""
    n, _, e_local = counts.shape
    order = arrival_order(n)
    dest = jnp.arange(n)[:, None]
    arriving = counts[order, dest]  # [dest, i, E_l]: the i-th source's rows, in arrival order
    start = _exclusive_cumsum(arriving.reshape(n, n * e_local), axis=1).reshape(n, n, e_local)
    kept = jnp.clip(rows - start, 0, arriving)
    offsets = _exclusive_cumsum(kept.sum(-1), axis=1)  # [dest, i]
    back = jnp.zeros_like(order).at[dest, order].set(jnp.arange(n)[None, :])  # [dest, source] → i
    return kept[dest, back].transpose(1, 0, 2), offsets[dest, back].T


def ep_ragged_local(x, choice, gate, w_in, w_out, *, num_experts: int, capacity_factor: float, kernels):
    """Per-device body of `ep_ragged` (module docstring). x: [T_l, H], choice/gate: [T_l], w_in: [E_l, H, 2I],
    w_out: [E_l, I, H] → DispatchResult(g · expert(x) [T_l, H] fp32, this device's dropped count)."""
    n_ep, me = jax.lax.axis_size("expert"), jax.lax.axis_index("expert")
    e_local, (t_local, h) = w_in.shape[0], x.shape
    rows = receive_rows(t_local, n_ep, capacity_factor)
    order = jnp.argsort(choice, stable=True)  # by expert, skip tokens last (never sent)
    counts = jnp.bincount(choice, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    every = jax.lax.all_gather(counts, "expert").reshape(n_ep, n_ep, e_local)  # [source, dest, local expert]
    kept, arrivals = fit_receive_buffer(every, rows)  # arrivals [source, dest]: where its rows begin in dest's
    sizes, sent = every.sum(-1), kept.sum(-1)  # [source, dest]: routed, and kept in dest's buffer
    starts = _exclusive_cumsum(sizes, axis=1)  # where each source's rows for dest begin in its sorted tokens
    recv = kernels.ragged_all_to_all(
        x[order], jnp.zeros((rows, h), x.dtype), starts[me], sent[me], arrivals[me], sent[:, me], "expert"
    )
    # each received row's local expert (E_l past the rows received: no expert, output 0)
    ends = jnp.cumsum(kept[arrival_order(n_ep)[me], me].reshape(-1))  # [(i-th source, expert)]
    segment = jnp.searchsorted(ends, jnp.arange(rows), side="right")
    local = jnp.where(segment < n_ep * e_local, segment % e_local, e_local).astype(jnp.int32)
    ones = jnp.ones((rows,), jnp.float32)
    y = kernels.grouped_swiglu(recv, local, ones, ExpertWeights(w_in, w_out)).astype(x.dtype)
    ret = kernels.ragged_all_to_all(
        y, jnp.zeros((t_local, h), x.dtype), arrivals[:, me], sent[:, me], starts[:, me], sent[me], "expert"
    )
    out = jnp.zeros_like(ret).at[order].set(ret)  # token order; dropped and skip tokens 0
    return DispatchResult(gated(out, choice, gate, num_experts), jnp.sum(sizes[me] - sent[me]).astype(jnp.int32))


def ep_dispatch(x, choice, gate, experts, cfg, kernels) -> DispatchResult:
    """`ep` with the `Dispatch` signature of `zaya_jax.model.experts` (see `_over_expert_axis`)."""
    return _over_expert_axis(ep_local, "ep", x, choice, gate, experts, cfg, kernels)


def ep_ragged_dispatch(x, choice, gate, experts, cfg, kernels) -> DispatchResult:
    """`ep_ragged` with the `Dispatch` signature of `zaya_jax.model.experts` (see `_over_expert_axis`)."""
    return _over_expert_axis(ep_ragged_local, "ep_ragged", x, choice, gate, experts, cfg, kernels)


def _over_expert_axis(local, name: str, x, choice, gate, experts, cfg, kernels) -> DispatchResult:
    """Inside a manual `shard_map` (the ZeRO-1 step) the per-device body `local` (local tokens, local experts, local
    dropped count); otherwise it needs an active mesh (`jax.set_mesh`) with axes data/context/expert and wraps
    the body in a `shard_map` (dropped summed over all devices). x: [T, H] → DispatchResult(out [T, H] fp32,
    dropped [])."""
    body = partial(local, num_experts=cfg.num_experts, capacity_factor=cfg.capacity_factor, kernels=kernels)
    w_in, w_out = experts.of_layer()
    if in_manual_region():
        return body(x, choice, gate, w_in, w_out)
    mesh = active_mesh()
    if mesh is None:
        raise ValueError(
            f"model.dispatch={name!r} needs an active device mesh with an 'expert' axis: build it with "
            "zaya_jax.parallel.mesh.make_mesh and run under `with jax.set_mesh(mesh):`"
        )

    def summed(*args):
        out, dropped = body(*args)
        return out, jax.lax.psum(dropped, AXES)

    tokens = sharding.token_spec()
    w_in, w_out = w_in.astype(x.dtype), w_out.astype(x.dtype)  # any gather of the weights moves the compute dtype
    out, dropped = jax.shard_map(
        summed,
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, P("expert"), P("expert")),
        out_specs=(tokens, P()),
        check_vma=False,
    )(x, choice, gate, w_in, w_out)
    return DispatchResult(out, dropped)
