"""Expert parallelism (EP) inside `jax.shard_map`: a fixed-capacity `all_to_all` dispatch.

Tokens are sharded over every mesh axis (data, context, expert); routed experts are sharded over
`expert` (E_l = E / n_ep local experts per device). Per device, with T_l local tokens:

1. pack: each local expert token goes to slot (e*, pos) of a send buffer [n_ep, E_l·C, H], where
   C = ceil(cf · T_l / E) slots per (source device, expert) and pos is its rank among the local tokens
   routed to e*; tokens with pos ≥ C are dropped (counted; they output 0, i.e. the residual passes);
2. `all_to_all` over `expert`: device j receives the rows for its experts from every peer;
3. local SwiGLU over [E_l, n_ep·C, H];
4. reverse `all_to_all`, unpack, scale by the gate g.

Skip-slot tokens use no capacity. With C ≥ T_l (cf ≥ E) nothing is dropped and the result equals the
dense reference. Expert weights are never gathered: only tokens move.
"""

from __future__ import annotations

from functools import partial

import jax
from jax.sharding import PartitionSpec as P

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


def ep_dispatch(x, choice, gate, experts, cfg, kernels) -> DispatchResult:
    """EP dispatch with the `Dispatch` signature of `zaya_jax.model.experts`. Inside a manual `shard_map` (the ZeRO-1
    step) it is the per-device body (local tokens, local experts, local dropped count); otherwise it needs an
    active mesh (`jax.set_mesh`) with axes data/context/expert and wraps the body in a `shard_map` (dropped
    summed over all devices). x: [T, H] → DispatchResult(out [T, H] fp32, dropped [])."""
    body = partial(ep_local, num_experts=cfg.num_experts, capacity_factor=cfg.capacity_factor, kernels=kernels)
    w_in, w_out = experts.of_layer()
    if in_manual_region():
        return body(x, choice, gate, w_in, w_out)
    mesh = active_mesh()
    if mesh is None:
        raise ValueError(
            "model.dispatch='ep' needs an active device mesh with an 'expert' axis: build it with "
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
