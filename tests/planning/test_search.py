"""The layout search: branch and bound over compiles (with a stand-in planner), its cache, and a searched
expert-parallel layout training the same model as data parallelism on 8 CPU devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from tests.tools.helpers import random_batch, tiny_config
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.planning.layouts import Layout, enumerate_layouts
from zaya_jax.planning.plan import plan
from zaya_jax.planning.search import Candidate, PlanCache, estimate, layout_config, predicted_peak, search
from zaya_jax.train.setup import prepare, prepare_abstract

USABLE = 100.0


def _candidate(i, est_step, floor, memory_floor=1.0, remat="dots", seqs=1, data=None) -> Candidate:
    """A stand-in layout (its own mesh unless `data` names another's) with the estimate the search reads."""
    layout = Layout(data or i + 1, 1, 1, microbatches=2 // seqs, sequences=seqs, remat=remat)
    estimate = {"step_s": est_step, "floor_s": floor, "memory_floor": memory_floor, "fixed_memory": 0.0}
    return Candidate(layout, ml_collections.ConfigDict({"id": i}), estimate)


def _fake_planner(steps: dict[int, float], peaks: dict[int, float]):
    """A planner that returns a plan's fields the search reads; records which configs it compiled."""
    calls = []

    def plan_fn(cfg):
        calls.append(cfg.id)
        step = steps[cfg.id]
        overlapped = {"step_s": step, "tokens_per_s_per_device": 1.0 / step}
        return {"projection": {"overlapped": overlapped}, "memory": {"peak_without_cpu_copies": peaks.get(cfg.id, 10.0),
                                                                      "usable": USABLE}}  # fmt: skip

    return plan_fn, calls


def test_search_prunes_by_memory_bound_and_budget(tmp_path):
    steps = {0: 1.0, 1: 0.8, 2: 2.0, 3: 0.9, 4: 0.5}
    plan_fn, calls = _fake_planner(steps, peaks={1: 160.0})  # layout 1 plans fastest; beyond 1.5 x usable
    cands = [
        _candidate(0, est_step=1.0, floor=0.5),
        _candidate(1, est_step=0.7, floor=0.4, remat="none"),
        _candidate(2, est_step=2.5, floor=1.2),  # its floor is above the best planned step: cannot win
        _candidate(3, est_step=0.95, floor=0.6),
        _candidate(4, est_step=0.3, floor=0.2, memory_floor=200.0),  # cannot fit: never compiled
        _candidate(
            5, est_step=0.75, floor=0.3, remat="none", seqs=2, data=2
        ),  # 1's mesh, more memory: cannot fit either
        _candidate(6, est_step=0.97, floor=0.3, remat="full", seqs=2, data=2),  # more sequences, but less kept: may fit
    ]
    cache = PlanCache(str(tmp_path))
    ranked = search(cands, plan_fn, budget=2, usable=USABLE, cache=cache, settings={})
    assert calls == [1, 3]  # in order of the estimate, two compiles
    by_id = {c.config.id: c for c in cands}
    assert by_id[4].skipped.startswith("cannot fit") and by_id[2].skipped.startswith("cannot win")
    assert by_id[5].skipped.startswith("cannot fit: needs at least the memory of")
    assert by_id[6].skipped == "compile budget spent"
    assert by_id[0].skipped == "compile budget spent"
    assert [c.config.id for c in ranked[:2]] == [3, 1]  # the fitting one first, the faster one that does not after
    assert not by_id[1].fits and by_id[3].fits

    # a second search with a larger budget reads the two plans from the cache and compiles only layout 0
    cands2 = [
        _candidate(0, est_step=1.0, floor=0.5),
        _candidate(1, est_step=0.7, floor=0.4, remat="none"),
        _candidate(3, est_step=0.95, floor=0.6),
    ]
    ranked2 = search(cands2, plan_fn, budget=5, usable=USABLE, cache=cache, settings={})
    assert calls == [1, 3, 0]
    assert [c.config.id for c in ranked2] == [3, 0, 1] and ranked2[0].cached and not ranked2[1].cached


def test_a_compiled_peak_bounds_the_peaks_of_fewer_tokens():
    """Peak = fixed + activations ∝ tokens per device per micro-batch: through (0, fixed memory) and the
    compiled point, on the same mesh or another with the same remat and expert axis."""
    planned = Candidate(Layout(128, 8, 1, 1, 8, "none"), ml_collections.ConfigDict(), {"fixed_memory": 40e9})
    planned.plan = {"memory": {"peak_without_cpu_copies": 500e9}}

    def predicted(layout, fixed=40e9):
        return predicted_peak(Candidate(layout, ml_collections.ConfigDict(), {"fixed_memory": fixed}), planned)

    assert predicted(Layout(128, 8, 1, 4, 2, "none")) == pytest.approx(40e9 + 460e9 * 2 / 8)
    assert predicted(Layout(64, 8, 2, 2, 4, "none"), fixed=50e9) == pytest.approx(50e9 + 460e9 * 2 / 8)  # context 2
    assert predicted(Layout(128, 8, 1, 1, 8, "full")) is None  # another remat
    assert predicted(Layout(1024, 1, 1, 4, 2, "none")) is None  # another expert axis
    assert predicted(Layout(128, 8, 1, 1, 8, "none", capacity_factor=2.0)) is None
    assert predicted(Layout(128, 8, 1, 1, 16, "none")) is None  # more tokens: no bound from below


def _train(config, steps: int = 3):
    mesh = make_mesh(config, jax.devices()[: int(config.mesh.data) * int(config.mesh.expert)])
    training = prepare(config, mesh)
    state, losses, dropped = training.state, [], []
    for k in range(steps):
        batch = random_batch(config.train.global_batch_size, config.train.seq_len, config.model.vocab_size, seed=k)
        state, metrics = training.step(state, batch)
        losses.append(float(metrics["loss"]))
        dropped.append(float(np.max(metrics["dropped_fraction"])))  # the worst layer
    return np.array(losses), np.array(dropped)


@pytest.fixture(scope="module")
def searched():
    """The search run on the tiny model's expert-parallel layouts of 2 data × 4 expert (one compile): the
    scaled-down shape of the winner on the paper's cluster (data × expert within a node). A fresh router's first
    steps run at load CV ≈ 1 and more (benchmarks/balancing/README.md; the tiny model's 4 experts: a layer
    can send every token to one expert, load CV sqrt(3)), so the capacity is picked for that: the cheapest
    of the grid that keeps the expected drop ≤ 1% there is a receive buffer of 4× a device's tokens
    (`ep_ragged`), which holds every token of the 4 devices: nothing can drop."""
    config = tiny_config()
    config.train.seq_len = 32
    layouts, _ = enumerate_layouts(config, 8, gpus_per_node=4, global_batch=16, load_cv=3**0.5)
    family = [lay for lay in layouts if (lay.data, lay.expert) == (2, 4)]
    cands = []
    for lay in family:
        cfg = layout_config(config, lay)
        mesh = make_mesh(cfg, jax.devices()[:8])
        params = prepare_abstract(cfg, mesh).checkpoint_target.params
        cands.append(Candidate(lay, cfg, estimate(cfg, params, 8, "mi300x", _cluster())))
    ranked = search(cands, lambda cfg: plan(cfg), budget=1, usable=192e9, cache=PlanCache(None), settings={})
    return config, ranked[0]


def _cluster():
    from zaya_jax.planning.cluster import Cluster

    return Cluster(gpus_per_node=4)


def test_a_searched_layout_trains_the_same_model_as_data_parallelism(searched):
    config, best = searched
    assert best.plan is not None and best.layout.expert == 4 and best.layout.expected_dropped <= 0.01
    assert best.layout.dispatch == "ep_ragged" and best.layout.capacity_factor == 4.0
    ep_config = best.layout.apply(config)
    dp_config = Layout(8, 1, 1, microbatches=1, sequences=2, remat="full").apply(config)
    losses, dropped = _train(ep_config)
    ref_losses, ref_dropped = _train(dp_config)
    print(f"searched {best.layout.name()}: losses {losses}, data:8 {ref_losses}, dropped {dropped}")
    assert np.all(ref_dropped == 0)  # dropless
    assert np.all(dropped <= 0.01), f"expert parallelism dropped {dropped} at cf {best.layout.capacity_factor}"
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)


def test_search_command_ends_with_the_winner_and_the_comparison(tmp_path):
    """`launch.plan --search` on 2 nodes × 4 devices with no new compiles beyond the paper's layout: the table,
    the not-planned reasons, and the three closing lines; the cache makes a second run compile nothing."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": repo}
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "launch.plan", "--config=experiments/zaya1_tiny.py", "--search", "--nodes=2",
           "--gpus_per_node=4", "--seq_len=64", "--search_budget=0", f"--search_cache={tmp_path / 'cache'}",
           f"--out={tmp_path / 'search.json'}"]  # fmt: skip
    runs = [subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = (proc.stdout.rstrip("\n").splitlines() for proc in runs)
    assert "planning the paper's layout first …" in first and "planning the paper's layout first …" not in second
    assert any(line.startswith("not planned: compile budget spent") for line in first)
    best, mfu, ratio = first[-3:]
    assert best.startswith("best layout: --config.mesh.data=8 ") and "--config.model.dispatch=dropless" in best
    assert mfu.startswith("projected MFU (overlapped): ") and ratio == "vs the paper's layout: 1.00x"
    record = json.loads((tmp_path / "search.json").read_text())
    # 3 meshes × (3 remat + overlap), less the overlap of the two expert-parallel meshes: there 2 chunks of the
    # tiny model's 2 layers would pad an owner group beyond OVERLAP_PADDING, so no chunks (the same program)
    assert record["paper"]["layout"]["data"] == 8 and len(record["ranked"]) == 10
    same = [line for line in record["left_out"] if "no layer chunks on this mesh" in line]
    assert len(same) == 2 and all("expert:" in line and "+overlap" in line for line in same), record["left_out"]
