"""`train.overlap_collectives`: the ZeRO-1 gradient reduce-scatter inside the last micro-batch's backward layer
loop (`zaya_jax.train.zero1.fused_backward`), layer chunks in the owner layouts (`zaya_jax.train.zero1.owners`) — same
gradients and losses as one device / as the one-reduce-scatter form, and the collectives really in the loop.

The gradient matrix runs a representative subset by default (each case compiles a step); set
ZAYA_ZERO1_FULL_MATRIX=1 for every mesh × {1, 4} micro-batches × overlap on/off."""

from __future__ import annotations

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from tests.tools.helpers import assert_trees_close, mean_loss_and_grads, random_batch, rel_err, tiny_config
from zaya_jax.model.zaya import abstract_model
from zaya_jax.parallel.mesh import AXES, make_mesh
from zaya_jax.planning import hlo_stats
from zaya_jax.planning.abstract_step import abstract_batch
from zaya_jax.train.setup import prepare, prepare_abstract
from zaya_jax.train.state import split_model
from zaya_jax.train.zero1 import layout as zero1
from zaya_jax.train.zero1.owners import SlotLayout, overlap_chunks, update_chunks
from zaya_jax.train.zero1.step import make_zero1_grads

MODEL = dict(num_layers=4, num_experts=16, capacity_factor=16.0, remat="full")  # layer chunks on every mesh
MESHES = [(1, 1), (8, 1), (4, 2), (2, 4), (3, 1), (6, 1)]
FULL = [(d, e, mb, ov) for (d, e), mb, ov in itertools.product(MESHES, (1, 4), (True, False))]
# + 2 × 4 with 4 micro-batches in the losses test; the last: the pipelined update's chunks, scattered after
SUBSET = [(8, 1, 4, True), (4, 2, 1, True), (3, 1, 4, True), (4, 2, 4, False)]


def _config(data: int, expert: int, microbatches: int = 1, overlap: bool = True, pipeline: bool = True, **model):
    config = tiny_config(**{**MODEL, **model})
    config.mesh.data, config.mesh.expert = data, expert
    config.train.seq_len = 32
    config.train.overlap_collectives, config.train.microbatches = overlap, microbatches
    config.train.pipeline_update = pipeline
    config.train.global_batch_size = microbatches * data * expert * (1 if (data * expert) % 3 else 2)
    return config


def _batch(config, seed: int = 0):
    return random_batch(config.train.global_batch_size, config.train.seq_len, config.model.vocab_size, seed)


def _mesh(config):
    return make_mesh(config, jax.devices()[: int(config.mesh.data) * int(config.mesh.expert)])


def test_layer_chunks_pad_little():
    """ZAYA1-base's 50 bins per layer on 8 devices: 20 chunks of 2 layers (100 bins → 13 per device, 2080 rows
    vs 2000). On 1024 and 96 devices only 2 chunks stay within the padding bound (2048 rows either way; 2 × 96 ×
    11 = 2112 vs 96 × 21 = 2016, +4.8%), and 20 layers a chunk is over `OVERLAP_CHUNK_LAYERS`: no chunks."""
    assert overlap_chunks((50,), (8,), 40) == 20
    assert overlap_chunks((50,), (1024,), 40) == 1
    assert overlap_chunks((50,), (96,), 40) == 1
    assert overlap_chunks((48,), (8,), 4) == 4  # one layer a chunk, no padding
    # a second group of 7 bins per layer on the same 96 devices: 2 chunks would need 2 × 96 × 2 = 384 rows
    # instead of 96 × 3 = 288, so no chunking (every group must stay within the bound)
    assert overlap_chunks((50, 7), (96, 96), 40) == 1
    layout = SlotLayout(40, 96, 16, ((),) * 50, ((),), chunks=2)
    assert (layout.chunk_slots, layout.slots, layout.rows) == (11, 22, 2112)
    assert layout.layer_row(0) == 0 and layout.layer_row(19) == 19 * 50 and layout.layer_row(20) == 96 * 11
    types = layout.row_types()  # device 95 of each chunk: positions 1045..1055 ≥ 1000 bins → empty
    assert types.shape == (96, 22) and (types[95] == -1).all() and (types[0] == 0).all()


def test_update_chunks_pad_nothing_and_leave_newton_schulz_to_hide_under():
    """The pipelined update's chunks (`owners.update_chunks`) for ZAYA1-base's 40 layers × 50 bins: on 8 devices
    5 chunks of 8 layers (400 bins → 50 a device, 2000 rows as unchunked; 8 chunks would pad to 2048); on 128,
    4 (4 slots a chunk; 8 chunks would have 2); on 96 any chunking pads (2016 rows unchunked, 2112 for 2); on
    1024 each device owns 1 bin a chunk, too little Newton–Schulz to hide anything under; one device has no
    all-gather. A second group counts in the slots a chunk and in the padding."""
    assert [update_chunks((50,), (n,), 40) for n in (8, 128, 96, 1024, 1)] == [5, 4, 1, 1, 1]
    assert update_chunks((50, 4), (8, 8), 40) == 5  # 4 bins a layer pad nothing at 5 chunks either (20 a chunk)
    assert update_chunks((50, 4), (8, 6), 40) == 1  # over 6 devices every chunking pads: 162 rows, 168 for 2


def test_chunked_owner_order_round_trips():
    """Checkpoint conversion with layer chunks (6 devices): packing every leaf into the owners' order and back
    gives the leaves again, and device d's rows are its s_c rows of each chunk."""
    config = _config(6, 1)
    mesh = AbstractMesh((6, 1, 1), AXES)
    layout = zero1.build_layout(config, mesh, split_model(abstract_model(config.model))[1])
    (group,) = layout.groups
    assert group.slots.chunks > 1
    keys = iter(jax.random.split(jax.random.key(0), len(layout.shapes)))
    values = {n: jax.random.normal(next(keys), shape) for n, shape in layout.shapes.items()}
    sizes = dict(mesh.shape)
    packed = zero1.pack_global(layout, sizes, values)
    back = zero1.unpack_global(layout, sizes, packed)
    for name, x in values.items():
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(x), err_msg=name)
    s = group.slots  # layer 0's first bin is row 0 of chunk 0, i.e. device 0's first slot
    first = zero1.layer_bins(s, {n: x[0] for n, x in values.items()}, jnp.float32)[0]
    np.testing.assert_array_equal(np.asarray(packed[0][0][0, 0]), np.asarray(first))
    layer = s.layers_per_chunk  # first layer of chunk 1: device 0's slot s_c
    first = zero1.layer_bins(s, {n: x[layer] for n, x in values.items()}, jnp.float32)[0]
    np.testing.assert_array_equal(np.asarray(packed[0][0][0, s.chunk_slots]), np.asarray(first))


@pytest.mark.parametrize(
    "data,expert,microbatches,overlap", FULL if os.environ.get("ZAYA_ZERO1_FULL_MATRIX") == "1" else SUBSET
)
def test_gradients_equal_single_device_dense(data, expert, microbatches, overlap):
    """remat=full with the in-loop reduce-scatter or the pipelined one after the backward, 1 and 4
    micro-batches: the mean gradients one device's dense step computes on the whole batch."""
    config = _config(data, expert, microbatches, overlap)
    mesh = _mesh(config)
    training = prepare(config, mesh)
    assert training.zero1.layout.scatter_in_backward == overlap
    assert max(g.slots.chunks for g in training.zero1.layout.groups) > 1  # chunked either way
    loss, grads, counts, _ = jax.device_get(
        make_zero1_grads(training.graphdef, training.zero1, config, mesh)(training.state, _batch(config))
    )
    reference = tiny_config(**{**MODEL, "dispatch": "dense", "remat": "none"})
    reference.train.seq_len, reference.train.global_batch_size = 32, config.train.global_batch_size
    ref_loss, ref_grads, ref_counts, _ = mean_loss_and_grads(reference, jax.devices()[:1], _batch(config))
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, f"mesh {data}x{expert}, {microbatches} micro-batches")
    np.testing.assert_array_equal(counts, ref_counts)


def _loop_collectives(config) -> tuple[dict[str, list[bool]], int]:
    """Per collective kind of the compiled step on data:8: for each op, whether it sits in a while body; and the
    owner layouts' layer chunks C."""
    mesh = _mesh(config)
    training = prepare_abstract(config, mesh)
    with jax.set_mesh(mesh):
        text = training.step.jitted.lower(training.state, abstract_batch(config, mesh)).compile().as_text()
    stats = hlo_stats.analyze(text, 8)
    out: dict[str, list[bool]] = {}
    for op, _ in stats.collective_ops:
        out.setdefault(op.kind, []).append(op.computation in stats.trip_counts)
    return out, max(g.slots.chunks for g in training.zero1.layout.groups)


@pytest.mark.parametrize("layers", [4, 8])
def test_reduce_scatter_runs_chunk_by_chunk_in_the_backward(layers):
    """data:8, 4 micro-batches: without overlap the Muon matrices are reduce-scattered once, after the
    backward; with it, once per layer chunk (C of them, none merged by XLA's combiner), chunk c + 1's issued in
    the chunk loop's body beside chunk c's backward — the loop runs C − 1 times, so at C = 2 XLA inlines it (4
    layers: 2 chunks of 2) and at C = 4 (8 layers) the scatters stay in a while body. The elementwise leaves'
    reduce-scatter runs at the top level either way (`train.pipeline_update` off for the one-scatter form)."""
    on, chunks = _loop_collectives(_config(8, 1, 4, True, num_layers=layers))
    off, one = _loop_collectives(_config(8, 1, 4, False, False, num_layers=layers))
    assert one == 1 and chunks > 1
    assert off["reduce-scatter"] == [False, False]  # the elementwise leaves' and the Muon matrices'
    if chunks == 2:
        assert on["reduce-scatter"] == [False] * 3
    else:  # chunk 0's and the elementwise leaves' after the loop
        assert sorted(on["reduce-scatter"]) == [False, False, True]


def test_pipelined_update_gathers_chunk_by_chunk():
    """data:8, 8 layers, overlap off: the pipelined update reduce-scatters and all-gathers the Muon slots once per
    layer chunk (C = 4 here; none merged), all at the top level after the backward, plus one of each for the
    elementwise leaves; without `train.pipeline_update`, one of each."""
    on, chunks = _loop_collectives(_config(8, 1, 4, False, True, num_layers=8))
    off, one = _loop_collectives(_config(8, 1, 4, False, False, num_layers=8))
    assert (chunks, one) == (4, 1)
    assert on["reduce-scatter"] == on["all-gather"] == [False] * (chunks + 1)
    assert off["reduce-scatter"] == off["all-gather"] == [False] * 2


def test_overlap_on_and_off_give_the_same_losses():
    """fp32 tiny model on 2 × 4 (data × expert), 4 micro-batches, 3 steps of training."""

    def losses(overlap):
        config = _config(2, 4, 4, overlap)
        mesh = _mesh(config)
        training = prepare(config, mesh)
        state, out = training.state, []
        for k in range(3):
            state, metrics = training.step(state, _batch(config, seed=k))
            out.append(float(metrics["loss"]))
        return out

    on, off = losses(True), losses(False)
    np.testing.assert_allclose(on, off, rtol=1e-5)
    assert on[0] != on[-1]  # it trained
