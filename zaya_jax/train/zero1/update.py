"""The ZeRO-1 optimizer update on one device, inside the train step's `shard_map` over all mesh axes
(arXiv 2511.17127 §2: ZeRO-1 distributed optimizer, distributed Muon; docs/parallelism.md).

It runs between the step's reduce-scatter and all-gather (`zaya_jax.train.zero1.step`). Per group
(`zaya_jax.train.zero1.layout`), with s owner slots of S elements and C flat elements on each device, given the
summed gradients of exactly what the device owns ([s, S] as one [s_c, S] piece per layer chunk, and [C]), their
Σ x² and 1 / tokens (which makes them means):

1. global-norm clipping (one scalar all-reduce over every device);
2. `muon_update`: momentum, then Newton–Schulz per owned matrix — per layer chunk a `lax.scan` over the
   device's slots of that chunk whose body `lax.switch`es on the slot's type (its pattern of matrix shapes), so
   a device orthogonalises only matrices it owns and no collective runs inside Newton–Schulz;
   `adam_update`: AdamW on the owned elements; both with decoupled weight decay and the group's scheduled
   learning rate, on fp32 master weights.

The math mirrors `zaya_jax.train.optimizer.make_optimizer` (optax's update order and bias corrections), which
tests use as the single-device reference.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.parallel.mesh import AXES
from zaya_jax.train import optimizer as optimizer_lib
from zaya_jax.train.zero1.layout import Group
from zaya_jax.train.zero1.owners import EMPTY, FlatLayout, SlotLayout
from zaya_jax.train.zero1.state import GroupState


def group_index(group: Group) -> jax.Array:
    """This device's index among the group's devices (the order `psum_scatter` / `all_gather` use)."""
    return jax.lax.axis_index(group.axes)


def _bias_correction(moment: jax.Array, decay: float, count: jax.Array) -> jax.Array:
    return moment / (1 - decay**count).astype(moment.dtype)


def _slot_branches(slots: SlotLayout, o: ml_collections.ConfigDict, dtype) -> list[Callable]:
    """One update program per slot type (+ one for empty slots): [S] momentum → [S] scaled Muon direction."""

    def branch(kind: tuple) -> Callable:
        def direction(m: jax.Array) -> jax.Array:
            parts, end = [], 0
            for rows, cols, offset in kind:
                x = m[offset : offset + rows * cols].reshape(rows, cols)
                u = optimizer_lib.orthogonalize(x, ns_steps=int(o.muon_ns_steps), dtype=dtype)
                scale = optimizer_lib.shape_scale(rows, cols, float(o.muon_consistent_rms))
                parts.append((u * scale).reshape(-1))
                end = offset + rows * cols
            parts.append(jnp.zeros((m.shape[0] - end,), m.dtype))
            return jnp.concatenate(parts)

        return direction

    return [branch(kind) for kind in slots.types] + [jnp.zeros_like]


def muon_update(
    slots: SlotLayout,
    types: jax.Array,
    state: GroupState,
    grads: tuple[jax.Array, ...],
    count: jax.Array,
    lr: jax.Array,
    o: ml_collections.ConfigDict,
    dtype,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """Owned Muon slots chunk by chunk of layers: grads [s_c, S] per layer chunk, fp32, types [s] → (new master
    [s_c, S] per chunk, new momentum [s, S]). Each chunk's Newton–Schulz is a loop of its own, needing only that
    chunk's gradients, so the step can all-gather chunk c while chunk c + 1's runs (`zaya_jax.train.zero1.step`)."""
    branches = _slot_branches(slots, o, dtype)
    which = jnp.where(types == EMPTY, len(branches) - 1, types)
    masters, moms, start = [], [], 0
    for g in grads:
        rows = slice(start, start + g.shape[0])
        start = rows.stop
        master, mom = _muon_rows(branches, which[rows], state.master_slots[rows], state.momentum[rows], g, count, lr, o)
        masters.append(master)
        moms.append(mom)
    return tuple(masters), jnp.concatenate(moms)


def _muon_rows(branches, which, master, momentum, grads, count, lr, o) -> tuple[jax.Array, jax.Array]:
    """Momentum, Newton–Schulz (one `lax.scan` over the rows, `lax.switch` on each row's type) and the decayed
    step for rows [r, S] of the owned slots: (new master [r, S], new momentum [r, S])."""
    beta = float(o.muon_momentum)
    mom = (1 - beta) * grads + beta * momentum
    if o.muon_nesterov:
        m_hat = beta * _bias_correction(mom, beta, count + 1) + (1 - beta) * _bias_correction(grads, beta, count)
    else:
        m_hat = _bias_correction(mom, beta, count)

    def one(_, xs):
        t, m = xs
        return None, jax.lax.switch(t, branches, m)

    _, direction = jax.lax.scan(one, None, (which, m_hat))
    if o.weight_decay > 0:
        direction = direction + float(o.weight_decay) * master
    return master + (-lr) * direction, mom


def adam_update(
    flat: FlatLayout,
    index: jax.Array,
    state: GroupState,
    grads: jax.Array,
    count: jax.Array,
    lr: jax.Array,
    o: ml_collections.ConfigDict,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Owned AdamW elements: grads [C] fp32 → (new master, mu, nu), each [C]."""
    b1, b2 = float(o.adam_b1), float(o.adam_b2)
    mu = (1 - b1) * grads + b1 * state.adam_mu
    nu = (1 - b2) * grads * grads + b2 * state.adam_nu
    u = _bias_correction(mu, b1, count) / (jnp.sqrt(_bias_correction(nu, b2, count)) + float(o.adam_eps))
    master = state.master_flat
    if o.weight_decay > 0 and flat.decayed:
        decayed = index * flat.chunk + jnp.arange(flat.chunk) < flat.decayed
        u = u + jnp.where(decayed, float(o.weight_decay) * master, 0.0)
    return master + (-lr) * u, mu, nu


def clip_scale(sq_norm_local: jax.Array, max_norm: float) -> tuple[jax.Array, jax.Array]:
    """(global gradient norm, factor to multiply the gradients by) from this device's Σ g² of what it owns."""
    norm = jnp.sqrt(jax.lax.psum(sq_norm_local, AXES))
    if max_norm <= 0:
        return norm, jnp.ones((), jnp.float32)
    return norm, jnp.where(norm < max_norm, 1.0, max_norm / norm)


def update(
    groups: tuple[Group, ...],
    states: tuple[GroupState, ...],
    sums: list[tuple[tuple[jax.Array, ...], jax.Array]],
    sq_sums: jax.Array,
    scale: jax.Array,
    count: jax.Array,
    lrs: dict[str, Callable],
    o: ml_collections.ConfigDict,
    dtype,
) -> tuple[tuple[GroupState, ...], list[tuple[tuple[jax.Array, ...], jax.Array]], jax.Array]:
    """Clip, then update every group's owned state. sums: per group (slots [s_c, S] per layer chunk, flat [C]) the
    owned gradient sums as reduce-scattered, sq_sums: their Σ x² (the step takes it piece by piece beside the
    scatters); scale: 1 / tokens, which makes them means; count: updates so far (the schedules' step). Returns
    (new local group states, the new masters per group as ([s_c, S] per chunk, [C]) for the all-gather, global
    norm of the means before clipping)."""
    norm, factor = clip_scale(sq_sums * scale * scale, float(o.grad_clip_norm))
    factor = factor * scale
    new_count = count + 1
    lr_muon, lr_adam = lrs["muon"](count), lrs["adam"](count)
    out, masters = [], []
    for group, state, (g_slots, g_flat) in zip(groups, states, sums):
        index = group_index(group)
        master_slots, momentum = (state.master_slots,), state.momentum
        if group.slots.num_bins:
            types = jnp.asarray(group.slots.row_types())[index]
            scaled = tuple(g.astype(jnp.float32) * factor for g in g_slots)
            master_slots, momentum = muon_update(group.slots, types, state, scaled, new_count, lr_muon, o, dtype)
        master_flat, mu, nu = state.master_flat, state.adam_mu, state.adam_nu
        if group.flat.size:
            master_flat, mu, nu = adam_update(
                group.flat, index, state, g_flat.astype(jnp.float32) * factor, new_count, lr_adam, o
            )
        out.append(GroupState(jnp.concatenate(master_slots), momentum, master_flat, mu, nu))
        masters.append((master_slots, master_flat))
    return tuple(out), masters, norm
