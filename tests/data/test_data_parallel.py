"""Parallel preparation: task planning, output independent of workers / machines, crash + rerun, bad input."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.tools import REPO as ROOT
from zaya_jax.data import inputs, packing, pipeline, tasks
from zaya_jax.data import prepare as prep
from zaya_jax.data.tokenizer import ByteTokenizer, DataError

KW = dict(seq_len=15, shard_size=3, task_bytes=300, eval_fraction=0.1, progress=False)


def _corpus(root) -> list[str]:
    """Documents in input order of a small corpus: 2 JSONL files (one cut into byte ranges), 3 text files."""
    os.makedirs(root, exist_ok=True)
    docs = []
    for name, n in (("a.jsonl", 40), ("c.jsonl", 7)):
        texts = [f"{name} record {i} " + "xyz" * (i % 5) + "é" * (i % 3) for i in range(n)]
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        docs.append((name, texts))
    for name in ("b.txt", "d.md", "e.txt"):
        text = f"plain file {name}\n" * 9
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write(text)
        docs.append((name, [text]))
    return [t for _, texts in sorted(docs) for t in texts]


def _files(out) -> dict[str, bytes]:
    """Every file of a prepared dir except the engine's logs and the lock, by relative path."""
    found = {}
    for p in sorted(glob.glob(os.path.join(out, "**"), recursive=True)):
        rel = os.path.relpath(p, out)
        if os.path.isfile(p) and not rel.startswith(".datatrove") and not rel.endswith(".lock"):
            found[rel] = open(p, "rb").read()
    return found


def _stream(out) -> list[int]:
    """The non-padding tokens of all rows in manifest order."""
    m = prep.load_manifest(out)
    toks = np.concatenate([np.load(os.path.join(out, s["tokens"])) for s in m["shards"]])
    segs = np.concatenate([np.load(os.path.join(out, s["segments"])) for s in m["shards"]])
    return toks[segs != 0].tolist()


def _expected_stream(docs) -> list[int]:
    """Independent reference: every document's UTF-8 bytes + 3 (byte tokenizer), then eos (1), in input order."""
    return [t for d in docs for t in [b + 3 for b in d.encode()] + [1]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("par")
    docs = _corpus(root / "in")
    out = str(root / "w1")
    manifest = prep.prepare([str(root / "in")], out, workers=1, **KW)
    return root, docs, out, manifest


def test_tasks_cut_jsonl_by_byte_range_and_cover_every_document(tmp_path):
    docs = _corpus(tmp_path)
    files = inputs.expand_inputs([str(tmp_path)])
    plan = tasks.plan_tasks(files, [os.path.getsize(f) for f in files], 300)
    assert any(start > 0 for task in plan for _, start, _ in task)  # a.jsonl is cut into ranges
    read = [text for task in plan for _, text in inputs.iter_chunk_documents(task)]
    assert read == docs
    assert tasks.plan_tasks(files, [os.path.getsize(f) for f in files], 300) == plan  # deterministic
    assert tasks.default_task_bytes(10 * 10**12) == 256 << 20 and tasks.default_task_bytes(1000) == 1 << 20


def test_reference_stream_and_split(reference):
    _, docs, out, manifest = reference
    assert manifest["num_tasks"] > 4 and manifest["num_documents"] == len(docs)
    assert _stream(out) == _expected_stream(docs)
    assert manifest["splits"]["eval"][1] == manifest["num_rows"] > manifest["splits"]["eval"][0]


def test_four_workers_write_identical_files(reference):
    root, _, out, manifest = reference
    out4 = str(root / "w4")
    assert prep.prepare([str(root / "in")], out4, workers=4, **KW) == manifest
    assert _files(out4) == _files(out)
    # A finished preparation is returned without work and without touching a file, whatever the worker count.
    mtimes = {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out4, "**"), recursive=True)}
    assert prep.prepare([str(root / "in")], out4, workers=2, **KW) == manifest
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out4, "**"), recursive=True)} == mtimes
    # A task directory deleted by hand: the engine's completion mark alone does not count, the task is redone.
    assert os.path.exists(os.path.join(out4, ".datatrove", "completions", "00002"))
    shutil.rmtree(os.path.join(out4, packing.task_name(2)))
    os.remove(os.path.join(out4, "manifest.json"))
    assert prep.prepare([str(root / "in")], out4, workers=2, **KW) == manifest
    assert _files(out4) == _files(out)


class _Crash(RuntimeError):
    pass


class _CountingByte(ByteTokenizer):
    calls = 0

    def encode_array(self, text):
        type(self).calls += 1
        return super().encode_array(text)


def test_crash_mid_task_then_rerun_gives_the_same_files(reference, monkeypatch):
    root, docs, out, manifest = reference
    crashed = str(root / "crashed")
    crash_at = len(manifest["shards"]) // 2
    flush = packing._Packer._flush
    calls = []

    def flaky_flush(self, nxt, final):
        calls.append(1)
        if len(calls) == crash_at:  # dies half-way through the job, after earlier tasks completed
            raise _Crash("killed")
        flush(self, nxt, final)

    monkeypatch.setattr(packing._Packer, "_flush", flaky_flush)
    with pytest.raises(_Crash):
        prep.prepare([str(root / "in")], crashed, workers=1, **KW)
    monkeypatch.setattr(packing._Packer, "_flush", flush)
    assert not os.path.exists(os.path.join(crashed, "manifest.json"))
    done_before = sorted(glob.glob(os.path.join(crashed, "task-*", "done.json")))
    assert done_before
    mtimes = {p: os.stat(p).st_mtime_ns for p in done_before}
    _CountingByte.calls = 0
    prep.prepare([str(root / "in")], crashed, workers=1, tokenizer=_CountingByte(), **KW)
    assert 0 < _CountingByte.calls < len(docs)  # only the unfinished tasks were redone
    assert {p: os.stat(p).st_mtime_ns for p in done_before} == mtimes  # finished tasks untouched
    assert _files(crashed) == _files(out)


@pytest.mark.slow
def test_four_separate_task_processes_like_four_machines(reference):
    """The SLURM array script, run as 4 array elements at once (the environment SLURM would give them)."""
    root, _, out, _ = reference
    sep = str(root / "sep")
    cmd = ["bash", os.path.join(ROOT, "launch", "slurm", "prepare_data.sbatch"), f"--input={root / 'in'}"]
    cmd += [f"--output={sep}", "--workers=1"] + [f"--{k}={v}" for k, v in KW.items() if k != "progress"]
    env = dict(os.environ, PYTHON=sys.executable, ZAYA_REPO=ROOT, SLURM_ARRAY_TASK_COUNT="4", SLURM_ARRAY_TASK_MIN="0")
    procs = [
        subprocess.Popen(cmd, env=dict(env, SLURM_ARRAY_TASK_ID=str(i)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(4)
    ]
    results = [(p.wait(timeout=240), p.stdout.read().decode()) for p in procs]
    assert [rc for rc, _ in results] == [0] * 4, results
    assert sum("documents" in text for _, text in results) >= 1  # the last one to finish wrote the manifest
    assert _files(sep) == _files(out)


def test_bad_record_in_a_later_task_is_one_error_and_leaves_nothing(tmp_path):
    _corpus(tmp_path / "in")
    with open(tmp_path / "in" / "c.jsonl", "a") as f:
        f.write('{"text": "ok"}\n{"body": "no text"}\n')
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"c\.jsonl:(\d+|byte \d+): no string field 'text'"):
        prep.prepare([str(tmp_path / "in")], str(out), workers=2, **KW)
    assert not out.exists()  # the failed fresh run removed the folder it made: a fixed rerun starts clean
    with pytest.raises(DataError, match="need workers >= 1"):
        prep.prepare([str(tmp_path / "in")], str(out), workers=2, num_nodes=2, node_rank=2, seq_len=8)


def test_iterator_state_survives_prefetch_and_process_count_changes(reference):
    _, _, out, _ = reference
    one = pipeline.make_train_iterator([out], seed=3, process_index=0, process_count=1, prefetch=True)
    one.next_batch(4)
    state = one.get_state()
    want = one.next_batch(4)
    one.close()
    halves = []
    for p in range(2):
        it = pipeline.make_train_iterator([out], seed=3, process_index=p, process_count=2, prefetch=False)
        it.set_state(state)
        halves.append(it.next_batch(4))
    for key in want:
        assert np.array_equal(np.concatenate([h[key] for h in halves]), want[key])


def test_source_maps_only_the_shards_it_reads_and_at_most_open_shards(reference, monkeypatch):
    _, _, out, manifest = reference
    monkeypatch.setattr(pipeline, "OPEN_SHARDS", 3)
    src = pipeline.PackedSource(out, "train")
    assert len(src._arrays) == 0 and len(manifest["shards"]) > 3
    first = manifest["shards"][0]
    row0 = np.load(os.path.join(out, first["tokens"]))[0]
    assert np.array_equal(src[0]["tokens"], row0) and len(src._arrays) == 1
    whole = np.concatenate([np.load(os.path.join(out, s["tokens"])) for s in manifest["shards"]])
    for i in range(len(src)):
        assert np.array_equal(src[i]["tokens"], whole[i])
        assert len(src._arrays) <= 3


def _feed_empty(fifo: str) -> threading.Thread:
    """A thread that opens the FIFO input for writing and closes it: its reader gets an empty file."""
    thread = threading.Thread(target=lambda: open(fifo, "w").close(), daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_sigkill_during_a_task_then_rerun_gives_the_same_files(tmp_path):
    """A real kill: the third task reads a FIFO, which blocks it until the test lets it go."""
    src = tmp_path / "in"
    src.mkdir()
    for name in ("a.txt", "b.txt", "d.txt"):
        (src / name).write_text(f"text of {name}\n" * 30)  # 420 bytes: one task each (task_bytes 300)
    fifo = str(src / "c.txt")
    os.mkfifo(fifo)
    ref = str(tmp_path / "ref")
    feeder = _feed_empty(fifo)
    prep.prepare([str(src)], ref, workers=1, **KW)
    feeder.join(5)
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "launch.prepare_data", f"--input={src}", f"--output={out}", "--workers=1"]
    cmd += [f"--{k}={v}" for k, v in KW.items() if k != "progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        marker = os.path.join(out, packing.task_name(1), packing.DONE)
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(marker) and proc.poll() is None  # tasks 0 and 1 done, task 2 blocked in the FIFO
    finally:
        proc.kill()
        proc.wait(30)
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    finished = glob.glob(os.path.join(out, "task-*", "*"))
    mtimes = {p: os.stat(p).st_mtime_ns for p in finished}
    feeder = _feed_empty(fifo)
    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    feeder.join(5)
    assert rerun.returncode == 0, rerun.stderr
    assert {p: os.stat(p).st_mtime_ns for p in finished} == mtimes  # what the killed run finished is kept as is
    assert _files(out) == _files(ref)
