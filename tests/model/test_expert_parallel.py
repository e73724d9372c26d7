"""`ep_ragged` (zaya_jax.model.expert_parallel) against NumPy: which tokens a device's receive buffer keeps, what
each kept token's expert computes, and the emulated ragged all-to-all XLA:CPU runs in place of the GPUs' one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tests.tools.helpers import tiny_config
from zaya_jax.kernels import ExpertWeights, resolve
from zaya_jax.kernels.ragged_exchange import ragged_all_to_all
from zaya_jax.model.expert_parallel import ep_ragged_dispatch, receive_rows
from zaya_jax.parallel.mesh import make_mesh

DATA, EXPERT, EXPERTS, T_LOCAL = 2, 4, 8, 16


def _numpy_swiglu(x, w_in, w_out):
    gate, up = np.split(x @ w_in, 2, axis=-1)
    return (gate / (1 + np.exp(-gate)) * up) @ w_out


def _numpy_ep_ragged(x, choice, gate, w_in, w_out, rows):
    """Each data group's EP devices fill each destination's `rows`-row buffer in arrival order (source device from
    the destination on, then expert, then token); tokens past it output 0. → (out [T, H], dropped)."""
    out, dropped = np.zeros_like(x), 0
    e_local = EXPERTS // EXPERT
    for d in range(DATA):
        blocks = [np.arange((d * EXPERT + s) * T_LOCAL, (d * EXPERT + s + 1) * T_LOCAL) for s in range(EXPERT)]
        for dest in range(EXPERT):
            filled = 0
            for tokens in blocks[dest:] + blocks[:dest]:  # its own device's first, then the next in turn
                for e in range(dest * e_local, (dest + 1) * e_local):
                    for t in tokens[choice[tokens] == e]:
                        if filled < rows:
                            out[t] = gate[t] * _numpy_swiglu(x[t], w_in[e], w_out[e])
                        else:
                            dropped += 1
                        filled += 1
    return out, dropped


@pytest.mark.parametrize("capacity_factor", [1.0, 1.5, EXPERT])
def test_ep_ragged_keeps_what_fits_each_receive_buffer(capacity_factor):
    config = tiny_config(num_experts=EXPERTS, dispatch="ep_ragged", capacity_factor=capacity_factor)
    config.mesh.data, config.mesh.expert = DATA, EXPERT
    m, h, i = config.model, config.model.hidden_size, config.model.moe_intermediate_size
    rng = np.random.default_rng(0)
    t = DATA * EXPERT * T_LOCAL
    x = rng.normal(size=(t, h)).astype(np.float32)
    # skewed routing: experts 4 and 5 (device 2's) take half the tokens, so its buffer overflows below cf 2
    probs = np.array([0.06] * 4 + [0.25, 0.25] + [0.06] * 2 + [0.14])
    choice = rng.choice(EXPERTS + 1, size=t, p=probs / probs.sum()).astype(np.int32)
    gate = rng.uniform(0.5, 1.5, size=t).astype(np.float32)
    w_in = (rng.normal(size=(EXPERTS, h, 2 * i)) / np.sqrt(h)).astype(np.float32)
    w_out = (rng.normal(size=(EXPERTS, i, h)) / np.sqrt(i)).astype(np.float32)
    rows = receive_rows(T_LOCAL, EXPERT, capacity_factor)
    mesh = make_mesh(config, jax.devices()[: DATA * EXPERT])
    with jax.set_mesh(mesh):
        out, dropped = jax.jit(lambda *a: ep_ragged_dispatch(*a[:3], ExpertWeights(*a[3:]), m, resolve(m)))(
            x, choice, gate, w_in, w_out
        )
    ref, ref_dropped = _numpy_ep_ragged(x, choice, gate, w_in, w_out, rows)
    assert int(dropped) == ref_dropped
    assert (ref_dropped > 0) == (capacity_factor < 2)  # device 2's load ≈ half of 4 × 16 tokens
    np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-5, atol=2e-5)


def test_emulated_ragged_all_to_all_places_every_peers_rows():
    """The XLA:CPU exchange: device s's rows for device d, taken from its input offset on, land in d's buffer
    after those of devices < s; rows nothing is written to keep the output's value."""
    n, rows, h, out_rows = 4, 6, 2, 9
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n * rows, h)).astype(np.float32)
    sizes = rng.integers(0, 3, size=(n, n)).astype(np.int32)  # [source, dest], ≤ 6 rows from each source

    def body(x, sizes):
        me = jax.lax.axis_index("expert")
        every = jax.lax.all_gather(sizes[0], "expert")
        starts, arrivals = jnp.cumsum(every, 1) - every, jnp.cumsum(every, 0) - every
        output = jnp.full((out_rows, h), -1.0)
        return ragged_all_to_all("cpu", x, output, starts[me], every[me], arrivals[me], every[:, me], "expert")

    mesh = Mesh(np.array(jax.devices()[:n]), ("expert",))
    f = jax.shard_map(body, mesh=mesh, in_specs=(P("expert"), P("expert")), out_specs=P("expert"), check_vma=False)
    out = np.asarray(jax.jit(f)(x, sizes)).reshape(n, out_rows, h)
    for dest in range(n):
        ref = np.full((out_rows, h), -1.0, np.float32)
        filled = 0
        for src in range(n):
            start = src * rows + sizes[src, :dest].sum()
            ref[filled : filled + sizes[src, dest]] = x[start : start + sizes[src, dest]]
            filled += sizes[src, dest]
        np.testing.assert_array_equal(out[dest], ref)
