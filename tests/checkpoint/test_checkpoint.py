"""Checkpoints: bitwise resume after SIGKILL, resume on 8 → 4 → 2 devices, restore onto other layouts,
reshard / HF export / HF import, retention and commit safety, and one-line errors for bad input.

Training runs are subprocesses (the device count is fixed per process); see `checkpoint_helpers`.
"""

from __future__ import annotations

import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

from launch.cli import EXIT_BAD_INPUT
from tests.tools.checkpoint_helpers import (  # noqa: F401 - data_dir is a fixture
    STEPS,
    config_overrides,
    data_dir,
    events,
    losses,
    metric_rows,
    random_state,
    read_state,
    run,
    tiny_mesh_config,
    train_cmd,
)
from zaya_jax.checkpoint import Checkpointer, CheckpointError, load_model
from zaya_jax.checkpoint.errors import CorruptCheckpointError
from zaya_jax.checkpoint.events import EventLog, read_events
from zaya_jax.checkpoint.faults import corrupt_step_dir
from zaya_jax.checkpoint.lock import LOCK_NAME


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """An uninterrupted 8-step run on 8 devices, checkpoints every 2 steps (all kept)."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    run(train_cmd(workdir, data_dir, 8), 8)
    return workdir


def _tree_stats(path: str) -> list[tuple]:
    """(path, size, mtime) of every file below `path` but the directory lock (taken by every writer)."""
    return sorted(
        (
            os.path.relpath(os.path.join(r, f), path),
            os.path.getsize(os.path.join(r, f)),
            os.path.getmtime(os.path.join(r, f)),
        )
        for r, _, fs in os.walk(path)
        for f in fs
        if f != LOCK_NAME
    )


@pytest.mark.slow
def test_resume_after_sigkill_is_bitwise_identical(reference, data_dir, tmp_path):
    workdir = str(tmp_path / "killed")
    first = run(train_cmd(workdir, data_dir, 8), 8, expect_rc=-9, ZAYA_FAULTS=f"sigkill@{STEPS // 2}")
    assert first.returncode == -9
    second = run(train_cmd(workdir, data_dir, 8), 8)
    restored = [e for e in events(workdir) if e["event"] == "restored"]
    assert len(restored) == 1 and restored[0]["step"] in (STEPS // 2 - 2, STEPS // 2)
    step = restored[0]["step"]  # the console says it resumed, and from where
    assert f"resumed from step {step} (checkpoint {os.path.join(workdir, 'checkpoints', str(step))})" in (
        second.stdout.splitlines()
    )
    ref_losses, got = losses(reference), losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, values in got.items():
        assert all(v == ref_losses[step][0] for v in values), f"step {step}: {values} vs {ref_losses[step]}"
    ref_state = read_state(os.path.join(reference, "checkpoints"), STEPS)
    state = read_state(os.path.join(workdir, "checkpoints"), STEPS)
    assert ref_state.keys() == state.keys()
    for name, value in ref_state.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)


@pytest.mark.slow
def test_resume_on_fewer_devices_matches(reference, data_dir, tmp_path):
    """8 → 4 → 2 devices (data = -1): same global batch and tokens, loss within 1e-5 relative."""
    workdir = str(tmp_path / "shrink")
    os.makedirs(os.path.join(workdir, "checkpoints"))
    for step in (2, 4):  # the reference's checkpoints up to the midpoint, as if it had stopped there
        shutil.copytree(
            os.path.join(reference, "checkpoints", str(step)), os.path.join(workdir, "checkpoints", str(step))
        )
    run(train_cmd(workdir, data_dir, 4), 4, ZAYA_FAULTS="sigterm@6")  # preempted after step 6: saves, exits 0
    run(train_cmd(workdir, data_dir, 2), 2)
    restored = [
        (e["step"], e["saved_mesh"]["data"], e["mesh"]["data"]) for e in events(workdir) if e["event"] == "restored"
    ]
    assert restored == [(4, 8, 4), (6, 4, 2)]
    ref = {r["step"]: r for r in metric_rows(reference)}
    got = {r["step"]: r for r in metric_rows(workdir)}
    assert sorted(got) == [5, 6, 7, 8]
    for step, row in got.items():
        assert row["global_batch"] == ref[step]["global_batch"] == 8
        assert row["tokens"] == ref[step]["tokens"], f"step {step}: different data"
        rel = abs(row["loss"] - ref[step]["loss"]) / abs(ref[step]["loss"])
        assert rel <= 1e-5, f"step {step}: loss {row['loss']} vs {ref[step]['loss']} (rel {rel:.2e})"


def test_restore_2x4_onto_4x2_and_8x1_is_identical(tmp_path):
    from zaya_jax.parallel.mesh import make_mesh
    from zaya_jax.train.optimizer import make_optimizer
    from zaya_jax.train.state import abstract_train_state

    config = tiny_mesh_config(dict(data=2, expert=4, context=1))
    host, state = random_state(config, make_mesh(config))
    ck = Checkpointer(str(tmp_path / "ck"))
    ck.save(3, state, {"data": None}, wait=True)
    for sizes in (dict(data=4, expert=2), dict(data=8, expert=1)):
        config.mesh.update(sizes)
        mesh = make_mesh(config)
        _, target, _ = abstract_train_state(config, mesh, make_optimizer(config))
        restored, meta = ck.restore(3, target)
        assert meta["step"] == 3
        for (path, got), want, tgt in zip(
            jax.tree_util.tree_flatten_with_path(restored)[0], jax.tree.leaves(host), jax.tree.leaves(target)
        ):
            assert got.sharding == tgt.sharding, jax.tree_util.keystr(path)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=jax.tree_util.keystr(path))
    ck.close()


@pytest.mark.slow
def test_reshard_cli_mesh_and_dtype(tmp_path):
    from zaya_jax.parallel.mesh import make_mesh

    config = tiny_mesh_config(dict(data=2, expert=4, context=1))
    host, state = random_state(config, make_mesh(config), seed=1)
    src = str(tmp_path / "src")
    ck = Checkpointer(src)
    ck.save(5, state, {"data": {"global_index": 40}, "config": config.to_dict()}, wait=True)
    ck.close()
    dst = str(tmp_path / "dst")
    out = run(
        [
            sys.executable,
            "-m",
            "launch.reshard",
            f"--src={src}",
            f"--dst={dst}",
            "--mesh=data:4,expert:2",
            "--dtype=bfloat16",
            "--param_sharding=fsdp",
        ],
        None,
    )
    assert '"mesh": {"data": 4, "context": 1, "expert": 2}' in out.stdout
    got = read_state(dst)
    want = {k: v for k, v in zip(read_state(src).keys(), jax.tree.leaves(host))}
    for name, value in want.items():
        if name.startswith("params/"):
            assert got[name].dtype == jnp.bfloat16, name
            np.testing.assert_array_equal(got[name], value.astype(jnp.bfloat16), err_msg=name)
        elif name.startswith(("biases/", "balancing/", "step")):
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    again = run(
        [sys.executable, "-m", "launch.reshard", f"--src={src}", f"--dst={dst}"], None, expect_rc=EXIT_BAD_INPUT
    )
    assert again.stderr.strip().splitlines()[-1].startswith("reshard: error: --dst=")


@pytest.mark.slow
def test_hf_export_matches_transformers_and_import_resumes(reference, data_dir, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_dir = str(tmp_path / "hf")
    run([sys.executable, "-m", "launch.reshard", f"--src={reference}", f"--to_hf={hf_dir}"], None)
    _, model = load_model(os.path.join(reference, "checkpoints"), overrides={"dispatch": "dropless"})
    ids = np.random.default_rng(0).integers(3, 300, (2, 24)).astype(np.int32)
    jax_logits = np.asarray(nnx.jit(lambda m, x: m.forward(x).logits)(model, jnp.asarray(ids)))
    hf_model = transformers.ZayaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    written = safetensors.numpy.load_file(os.path.join(hf_dir, "model.safetensors"))
    for name, value in written.items():  # transformers 5.24 from_pretrained resets the skip-slot bias
        if name.endswith("balancing_biases"):
            hf_model.get_buffer(name).copy_(torch.from_numpy(value))
    with torch.no_grad():
        hf_logits = hf_model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    rel = np.max(np.abs(hf_logits - jax_logits)) / np.max(np.abs(jax_logits))
    assert rel <= 1e-4, f"HF export logits differ: relative error {rel:.2e}"

    workdir = str(tmp_path / "imported")
    run(
        [
            sys.executable,
            "-m",
            "launch.reshard",
            f"--from_hf={hf_dir}",
            f"--dst={workdir}/checkpoints",
            *config_overrides(data_dir),
        ],
        8,
    )
    imported, final = (
        read_state(os.path.join(workdir, "checkpoints"), 0),
        read_state(os.path.join(reference, "checkpoints"), STEPS),
    )
    for name in final:
        if name.startswith(("params/", "biases/")):
            np.testing.assert_array_equal(imported[name], final[name], err_msg=name)
    run(train_cmd(workdir, data_dir, 8), 8)
    assert [e["step"] for e in events(workdir) if e["event"] == "restored"] == [0]
    assert losses(workdir)[1][0] < losses(reference)[1][0]  # starts from the trained weights, same first batch


def test_retention_and_commit_safety(tmp_path, monkeypatch):
    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    from zaya_jax.parallel.mesh import make_mesh

    _, state = random_state(config, make_mesh(config))
    ck = Checkpointer(str(tmp_path / "ck"), keep=2, keep_every=4)
    for step in range(1, 10):
        ck.save(step, state, {"data": None})
        assert len(ck.committed_steps()) >= min(step - 1, 2)  # the previous ones stay until the new one commits
    ck.wait()
    assert ck.committed_steps() == [4, 8, 9]  # Orbax's preservation policy: newest 2 plus multiples of 4
    os.makedirs(os.path.join(ck.directory, "10.orbax-checkpoint-tmp-123"))  # an interrupted save
    monkeypatch.setattr(ck.manager, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(CheckpointError, match="step 10 .* failed: No space left on device; earlier checkpoints"):
        ck.save(10, state, {"data": None})
    assert ck.committed_steps() == [4, 8, 9]  # the previous good checkpoints survive a failed save
    assert ck.uncommitted() == ["10.orbax-checkpoint-tmp-123"]
    monkeypatch.undo()
    ck.close()
    events = tmp_path / "events.jsonl"
    ck = Checkpointer(str(tmp_path / "ck"), keep=2, keep_every=4, events=EventLog(str(events), "test"))
    ck.manager.wait_until_finished()  # Orbax removes the leftovers of interrupted saves when it opens the directory
    assert not ck.uncommitted() and ck.committed_steps() == [4, 8, 9]
    assert [e["path"].rsplit("/", 1)[1] for e in read_events(str(events))] == ["10.orbax-checkpoint-tmp-123"]
    with pytest.raises(CheckpointError, match="step 9 already exists"):
        ck.save(9, state, {"data": None})
    monkeypatch.setattr("zaya_jax.checkpoint.manager.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(1, 1, 1))
    with pytest.raises(CheckpointError, match="not enough free space"):
        ck.save(11, state, {"data": None})
    assert ck.committed_steps() == [4, 8, 9] and not ck.uncommitted()


def test_bad_inputs_give_one_line_errors(tmp_path, monkeypatch):
    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    from zaya_jax.parallel.mesh import make_mesh
    from zaya_jax.train.optimizer import make_optimizer
    from zaya_jax.train.state import abstract_train_state

    _, state = random_state(config, make_mesh(config))
    ck_dir = str(tmp_path / "ck")
    ck = Checkpointer(ck_dir)
    ck.save(2, state, {"data": None, "config": config.to_dict()}, wait=True)
    ck.close()
    ck = Checkpointer(ck_dir)
    before = _tree_stats(ck_dir)
    _, same, _ = abstract_train_state(config, make_mesh(config), make_optimizer(config))
    config.model.hidden_size = 32
    _, other, _ = abstract_train_state(config, make_mesh(config), make_optimizer(config))
    with pytest.raises(CheckpointError) as err:
        ck.restore(2, other)
    assert "'params/embed' has shape [384, 64] but the config gives [384, 32]" in str(err.value)
    assert "\n" not in str(err.value) and _tree_stats(ck_dir) == before
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "partial" / "4.orbax-checkpoint-tmp")
    with pytest.raises(CheckpointError, match="only interrupted saves"):
        load_model(str(tmp_path / "partial"))
    broken = str(tmp_path / "broken")
    shutil.copytree(ck_dir, broken)
    corrupt_step_dir(os.path.join(broken, "2"))
    with pytest.raises(CorruptCheckpointError, match="step 2 .* is unreadable"):
        Checkpointer(broken, read_only=True).restore(2, same)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permission bits: emulate a read-only mount
        monkeypatch.setattr("zaya_jax.checkpoint.manager.os.access", lambda *a: False)
    with pytest.raises(CheckpointError, match="is not writable"):
        Checkpointer(str(read_only / "checkpoints"))
    assert not os.path.exists(read_only / "checkpoints")


@pytest.mark.slow
def test_train_cli_reports_shape_mismatch(reference, data_dir, tmp_path):
    workdir = str(tmp_path / "mismatch")
    shutil.copytree(os.path.join(reference, "checkpoints"), os.path.join(workdir, "checkpoints"))
    before = _tree_stats(os.path.join(workdir, "checkpoints"))
    proc = run(train_cmd(workdir, data_dir, 8, "--config.model.moe_intermediate_size=32"), 8, expect_rc=EXIT_BAD_INPUT)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("train: error: checkpoint step 8 in ") and "cannot resume with model.moe_int" in last, last
    assert _tree_stats(os.path.join(workdir, "checkpoints")) == before
