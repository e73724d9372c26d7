"""Checkpoint metadata on resume: always hashed (a stripped hash is corruption unless the format predates it),
and a config that differs from the checkpoint's is listed in one line and an event, or refused where the
field cannot change (model shape, vocabulary)."""

from __future__ import annotations

import json
import logging
import os
import shutil

import jax
import pytest

from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
from zaya_jax.checkpoint import CheckpointConfigError, make_checkpointer
from zaya_jax.checkpoint.events import read_events
from zaya_jax.checkpoint.integrity import DIGEST_KEY
from zaya_jax.parallel.mesh import make_mesh


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A workdir with committed steps 2 and 4 of the tiny config (random states), and what restores it."""
    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    with config.unlocked():
        config.checkpoint.async_save = False
    _, state = random_state(config, make_mesh(config))
    shardings = jax.tree.map(lambda x: x.sharding, state)
    root = str(tmp_path_factory.mktemp("meta") / "pristine")
    ck = make_checkpointer(config, root, handle_signals=False)
    ck._shardings = shardings
    for step in (2, 4):
        ck.save_now(step, state)
    ck.finish(4, state)
    return config, state, shardings, root


def _copy(saved, tmp_path) -> str:
    workdir = str(tmp_path / "w")
    shutil.copytree(saved[3], workdir)
    return workdir


def _edit_meta(workdir: str, step: int, edit) -> None:
    path = os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    edit(meta)
    with open(path, "w") as f:
        json.dump(meta, f)


def _restore(config, workdir: str, saved) -> tuple[int, list[dict]]:
    ck = make_checkpointer(config, workdir, handle_signals=False)
    try:
        ck.restore_or_keep(saved[1], saved[2])
    finally:
        ck.lock.release()
    rows = read_events(os.path.join(workdir, "events.jsonl"))
    return next(r["step"] for r in reversed(rows) if r["event"] == "restored"), rows


def test_saved_metadata_is_hashed_with_its_format_version(saved):
    with open(os.path.join(saved[3], "checkpoints", "4", "meta", "metadata")) as f:
        meta = json.load(f)
    assert meta["format_version"] == 2 and len(meta[DIGEST_KEY]) == 64


def test_metadata_edited_and_stripped_of_its_hash_is_quarantined(saved, tmp_path):
    workdir = _copy(saved, tmp_path)

    def edit(meta):
        meta["seed"] = 12345  # an edit a resume would act on silently
        del meta[DIGEST_KEY]

    _edit_meta(workdir, 4, edit)
    step, rows = _restore(saved[0], workdir, saved)
    assert step == 2
    corrupt = [r for r in rows if r["event"] == "checkpoint_corrupt"]
    assert [r["step"] for r in corrupt] == [4] and "lost its checksum" in corrupt[0]["error"]
    assert os.path.isdir(os.path.join(workdir, "checkpoints.corrupt"))


def test_metadata_of_the_format_before_the_hash_is_accepted_without_one(saved, tmp_path):
    workdir = _copy(saved, tmp_path)

    def edit(meta):
        meta["format_version"] = 1
        del meta[DIGEST_KEY]

    _edit_meta(workdir, 4, edit)
    step, rows = _restore(saved[0], workdir, saved)
    assert step == 4 and not any(r["event"] == "checkpoint_corrupt" for r in rows)


def test_a_changed_config_is_listed_in_one_line_and_an_event(saved, tmp_path, caplog):
    workdir = _copy(saved, tmp_path)
    config = saved[0].copy_and_resolve_references()
    with config.unlocked():
        config.optimizer.learning_rate = 1e-3
        config.train.global_batch_size = 16
    with caplog.at_level(logging.WARNING, logger="zaya_jax.checkpoint.trainer"):
        step, rows = _restore(config, workdir, saved)
    assert step == 4
    changed = [r for r in rows if r["event"] == "config_changed"]
    assert len(changed) == 1 and set(changed[0]["changes"]) == {"optimizer.learning_rate", "train.global_batch_size"}
    assert changed[0]["changes"]["train.global_batch_size"] == {"saved": 8, "now": 16}
    lines = [r.getMessage() for r in caplog.records if "changed config" in r.getMessage()]
    assert lines == [
        "resuming step 4 with a changed config: optimizer.learning_rate 0.003 -> 0.001, train.global_batch_size 8 -> 16"
    ], lines


def test_an_unchanged_config_reports_nothing(saved, tmp_path):
    _, rows = _restore(saved[0], _copy(saved, tmp_path), saved)
    assert not any(r["event"] == "config_changed" for r in rows)


@pytest.mark.parametrize(
    "section, field, value, shown",
    [("model", "hidden_size", 32, "model.hidden_size 64 -> 32"), ("data", "tokenizer", "/tok.json", "'byte' ->")],
)
def test_a_change_of_shape_or_vocabulary_is_refused_in_one_line(saved, tmp_path, section, field, value, shown):
    workdir = _copy(saved, tmp_path)
    config = saved[0].copy_and_resolve_references()
    with config.unlocked():
        config[section][field] = value
    with pytest.raises(CheckpointConfigError) as err:
        _restore(config, workdir, saved)
    msg = str(err.value)
    assert shown in msg and "cannot resume" in msg and "\n" not in msg, msg
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))  # refused, not quarantined
