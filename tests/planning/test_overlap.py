"""The planner's overlap rule (`zaya_jax.planning.overlap`) on known programs: a collective inside a loop body hides
under at most that body's dot FLOPs; one at the top level under the compute it neither feeds nor waits for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zaya_jax.planning import hlo_stats, overlap
from zaya_jax.planning.cluster import Cluster

LAYERS, M, K = 6, 32, 64


def _program(x, ws):
    """Per device: a scan of LAYERS [M, K] @ [K, K] matmuls, each iteration all-gathering its [K/8, K] weight
    shard (a loop-body collective), then a top-level psum of the result."""

    def body(c, w):
        w = jax.lax.all_gather(w, "d", tiled=True)  # [K, K]
        return jnp.tanh(c @ w), None

    y = jax.lax.scan(body, x, ws)[0]
    return jax.lax.psum(y, "d")


def _stats():
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    fn = jax.jit(jax.shard_map(_program, mesh=mesh, in_specs=(P(), P(None, "d")), out_specs=P(), check_vma=False))
    x = jax.ShapeDtypeStruct((M, K), jnp.float32)
    ws = jax.ShapeDtypeStruct((LAYERS, K, K), jnp.float32)
    return hlo_stats.analyze(fn.lower(x, ws).compile().as_text(), 8)


@pytest.mark.parametrize("peak", [1e9, 1e15])  # the body's compute covers its all-gather, or does not
def test_loop_collectives_hide_up_to_their_body_compute(peak):
    stats, cluster = _stats(), Cluster()
    rows = {tuple(r.kinds): r for r in overlap.bodies(stats, cluster, peak)}
    gather, reduce = rows[("all-gather",)], rows[("all-reduce",)]
    assert gather.loop and gather.runs == LAYERS and not reduce.loop and reduce.runs == 1
    body_flops = 2 * M * K * K  # one iteration's matmul, by hand
    assert gather.compute_s == pytest.approx(body_flops / peak)
    assert gather.trips == LAYERS  # the last iteration's all-gather has no later iteration to overlap with
    assert gather.hidden_s == pytest.approx((LAYERS - 1) * min(gather.collective_s, body_flops / peak))
    assert reduce.hidden_s == 0 and reduce.exposed_s == pytest.approx(reduce.total_s) and reduce.total_s > 0
    projected = {"step_s": 1.0, "collective_s": gather.total_s + reduce.total_s, "tokens_per_s_per_device": 10.0}
    out = overlap.overlapped(projected, [gather, reduce], model_flops=peak * 0.5, peak_flops=peak)
    assert out["step_s"] == pytest.approx(1.0 - gather.hidden_s)
    assert out["mfu"] == pytest.approx(0.5 / out["step_s"])
    assert out["exposed_s"] == pytest.approx(reduce.total_s + gather.exposed_s)


def _chunked_program(x, ws):
    """Per device: an outer loop over 3 chunks, each running a nested loop of 2 [M, K] @ [K, K] matmuls and then
    reduce-scattering the chunk's result (the shape of the ZeRO-1 step's chunked backward)."""

    def chunk(c, w2):
        c = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), c, w2)[0]
        return c, jax.lax.psum_scatter(c, "d", scatter_dimension=0, tiled=True)

    return jax.lax.scan(chunk, x, ws.reshape(3, 2, K, K))[1]


def test_a_nested_loop_is_no_cover():
    """The chunk loop's reduce-scatter can only overlap with its own body's GEMMs, and that body has none: its
    matmuls are in a nested loop, which the GPU compiler does not schedule a collective across."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    fn = jax.jit(jax.shard_map(_chunked_program, mesh=mesh, in_specs=(P(), P()), out_specs=P(), check_vma=False))
    x, ws = jax.ShapeDtypeStruct((M, K), jnp.float32), jax.ShapeDtypeStruct((6, K, K), jnp.float32)
    stats = hlo_stats.analyze(fn.lower(x, ws).compile().as_text(), 8)
    assert stats.dot_flops == 6 * 2 * M * K * K  # every matmul still counts in the step's compute
    (row,) = [r for r in overlap.bodies(stats, Cluster(), 1e9) if "reduce-scatter" in r.kinds]
    assert row.loop and row.trips == 3 and row.compute_s == 0.0 and row.hidden_s == 0.0


def _pipelined_program(gs):
    """Per device, the shape of the pipelined ZeRO-1 update: per chunk a loop of [K, K] @ [K, K] matmuls over
    the chunk's 2 rows (Newton–Schulz) and then an all-gather of its result; the chunks are independent."""
    out = []
    for g in gs:
        m = jax.lax.scan(lambda _, x: (None, jnp.tanh(x @ x)), None, g)[1]
        out.append(jax.lax.all_gather(m, "d", tiled=True))
    return out


@pytest.mark.parametrize("chunks", [1, 3])
def test_top_level_collectives_hide_under_independent_loops(chunks):
    """Chunk c's all-gather hides under the other chunks' loops, not its own (it waits for it): the smallest of
    them stays exposed. One chunk: its all-gather waits for the only loop and hides nothing."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    fn = jax.jit(jax.shard_map(_pipelined_program, mesh=mesh, in_specs=(P(),), out_specs=P(), check_vma=False))
    gs = [jax.ShapeDtypeStruct((2, K, K), jnp.float32)] * chunks
    stats = hlo_stats.analyze(fn.lower(gs).compile().as_text(), 8)
    (row,) = overlap.bodies(stats, Cluster(), 1e9)
    assert not row.loop and row.kinds == ("all-gather",)
    gathers = [op for op, _ in stats.collective_ops]
    assert len(gathers) == chunks and all(stats.top_waits[op.name] or chunks == 1 for op in gathers)
    loop_s = 2 * (2 * K * K * K) / 1e9  # one chunk's loop: 2 matmuls, by hand
    each = Cluster().collective(gathers[0]).seconds
    if chunks == 1:
        assert row.hidden_s == 0.0 and row.cover_s == 0.0
    else:
        assert row.cover_s == pytest.approx(chunks * loop_s)
        assert row.hidden_s == pytest.approx(min((chunks - 1) * each, chunks * loop_s))
