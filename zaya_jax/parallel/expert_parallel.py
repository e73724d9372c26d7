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

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from zaya_jax.model.moe import DispatchResult, capacity, slot_positions, swiglu
from zaya_jax.parallel.mesh import AXES

TOKEN_AXES = ("data", "expert", "context")  # blocks of a flattened [B·S] token dim (`sharding.flatten_tokens`)


def _local_ep(x, choice, gate, w_in, w_out, *, num_experts: int, capacity_factor: float):
    """Per-device body. x: [T_l, H], choice/gate: [T_l], w_in: [E_l, H, 2I], w_out: [E_l, I, H]."""
    n_ep = jax.lax.axis_size("expert")
    e_local, (t_local, h) = w_in.shape[0], x.shape
    cap = capacity(t_local, num_experts, capacity_factor)
    pos = slot_positions(choice, num_experts)
    is_expert = choice < num_experts
    keep = is_expert & (pos < cap)
    trash = num_experts * cap
    slot = jnp.where(keep, choice * cap + pos, trash)
    send = jnp.zeros((trash + 1, h), x.dtype).at[slot].set(x)[:-1].reshape(n_ep, e_local * cap, h)
    recv = jax.lax.all_to_all(send, "expert", 0, 0, tiled=True)  # [n_ep (source), E_l·C, H]
    local_in = recv.reshape(n_ep, e_local, cap, h).transpose(1, 0, 2, 3).reshape(e_local, n_ep * cap, h)
    local_out = swiglu(local_in, w_in, w_out)
    back = local_out.reshape(e_local, n_ep, cap, h).transpose(1, 0, 2, 3).reshape(n_ep, e_local * cap, h)
    ret = jax.lax.all_to_all(back, "expert", 0, 0, tiled=True).reshape(trash, h)  # global expert order
    ret = jnp.concatenate([ret, jnp.zeros((1, h), ret.dtype)], axis=0)
    out = ret[slot] * gate[:, None].astype(x.dtype)
    dropped = jax.lax.psum(jnp.sum(is_expert & ~keep).astype(jnp.int32), AXES)
    return out, dropped


def ep_dispatch(x, choice, gate, w_in, w_out, cfg) -> DispatchResult:
    """EP dispatch with the `Dispatch` signature of `zaya_jax.model.moe`; needs an active mesh
    (`jax.set_mesh`) with axes data/context/expert. x: [T, H] → DispatchResult(out [T, H], dropped [])."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "expert" not in mesh.axis_names:
        raise ValueError("model.dispatch='ep' needs an active device mesh with an 'expert' axis: build it with "
                         "zaya_jax.parallel.mesh.make_mesh and run under `with jax.set_mesh(mesh):`")
    tokens = P(TOKEN_AXES)
    body = jax.shard_map(
        lambda *a: _local_ep(*a, num_experts=cfg.num_experts, capacity_factor=cfg.capacity_factor),
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, P("expert"), P("expert")),
        out_specs=(tokens, P()),
        check_vma=False,
    )
    out, dropped = body(x, choice, gate, w_in, w_out)
    return DispatchResult(out, dropped)
