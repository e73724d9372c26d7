"""Data pipeline tests: tokenizer, offline packing, resumable preparation, Grain iterator state."""

from __future__ import annotations

import glob
import json
import math
import os
import sys
from collections import Counter

import numpy as np
import pytest

from zaya_jax.data import corpus, pipeline
from zaya_jax.data import prepare as prep
from zaya_jax.data.tokenizer import ByteTokenizer, DataError, load_tokenizer


def _write(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def _jsonl(path, texts) -> str:
    return _write(path, "".join(json.dumps({"text": t}) + "\n" for t in texts))


def _all_rows(out):
    """(tokens, segments) of every row of a prepared dir, read with plain np.load."""
    m = json.load(open(os.path.join(out, "manifest.json")))
    toks = np.concatenate([np.load(os.path.join(out, s["tokens"])) for s in m["shards"]])
    segs = np.concatenate([np.load(os.path.join(out, s["segments"])) for s in m["shards"]])
    return m, toks, segs


def _hf_tokenizer_file(path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "</s>": 1, "<s>": 2, "hello": 3, "world": 4, "[UNK]": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


# --------------------------------------------------------------------------- tokenizers
def test_byte_tokenizer_round_trip_and_vocab():
    tok = load_tokenizer("byte")
    text = "héllo ✓\n"
    ids = tok.encode(text)
    assert ids == [b + 3 for b in text.encode("utf-8")]
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert tok.vocab_size == 384 and tok.vocab_size % 128 == 0 and max(tok.encode("\xff" * 3)) < 259


def test_hf_tokenizer_wrapper(tmp_path):
    tok = load_tokenizer(_hf_tokenizer_file(tmp_path / "tokenizer.json"))
    assert tok.encode("hello world hello") == [3, 4, 3]
    batch = tok.encode_batch(["hello world hello", "", "world"])
    assert [b.tolist() for b in batch] == [[3, 4, 3], [], [4]] and all(b.dtype == np.int32 for b in batch)
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (1, 2, 0)
    assert tok.vocab_size == 128  # 6 tokens padded to a multiple of 128
    assert tok.describe()["sha256"] and tok.decode([3, 4]) == "hello world"
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.json"))


def test_trained_bpe_round_trips_merges_the_frequent_bytes_and_is_never_overwritten(tmp_path):
    from zaya_jax.data.bpe import train_bpe

    text = "".join(f"def spam_{i}(eggs, ham={i * i}):\n    return eggs + {i % 7}\n\n" for i in range(400))
    _write(tmp_path / "in" / "a.py", text)
    tok = train_bpe([str(tmp_path / "in")], 300, str(tmp_path / "tok"))
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.raw_vocab_size) == (0, 1, 2, 300)
    sample = "def spam(eggs):\n    return eggs + 1\n é✓"  # unseen characters fall back to bytes
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample and len(ids) < len(sample.encode()) / 2 and max(ids) < 300
    path = str(tmp_path / "tok" / "tokenizer.json")
    before = open(path, "rb").read()
    assert train_bpe([str(tmp_path / "in")], 300, path).sha256 == tok.sha256  # the same tokenizer: reused
    with pytest.raises(DataError, match="never overwritten"):
        train_bpe([str(tmp_path / "in")], 290, path)
    assert open(path, "rb").read() == before


# --------------------------------------------------------------------------- packing
def test_packing_matches_independent_reference(tmp_path):
    src = tmp_path / "in"
    _write(src / "a.txt", "ab")
    _jsonl(src / "b.jsonl", ["cde", "  ", "fghij"])  # the blank record is skipped
    _write(src / "c.md", "k")
    m, toks, segs = (
        prep.prepare([str(src)], str(tmp_path / "out"), seq_len=3, shard_size=2, progress=False),
        *_all_rows(tmp_path / "out")[1:],
    )
    # Independent packing: concatenate (bytes + 3, eos) per document, cut rows of 4, pad the tail.
    docs = ["ab", "cde", "fghij", "k"]
    stream, owner = [], []
    for d, text in enumerate(docs):
        stream += [c + 3 for c in text.encode()] + [1]
        owner += [d] * (len(text) + 1)
    n_rows = math.ceil(len(stream) / 4)
    stream += [0] * (n_rows * 4 - len(stream))
    owner += [None] * (n_rows * 4 - len(owner))
    assert toks.tolist() == np.array(stream).reshape(n_rows, 4).tolist()
    for r in range(n_rows):
        row_owner = owner[4 * r : 4 * r + 4]
        rank = {d: i + 1 for i, d in enumerate(dict.fromkeys(o for o in row_owner if o is not None))}
        assert segs[r].tolist() == [rank.get(o, 0) for o in row_owner]
    assert (m["num_documents"], m["num_tokens"], m["num_rows"]) == (4, 15, 4)
    assert [s["rows"] for s in m["shards"]] == [2, 2]
    # Batches: labels shifted by one, loss_mask 0 across documents and on padding.
    batch = pipeline.rows_to_batch([dict(tokens=t, segment_ids=s) for t, s in zip(toks, segs)])
    assert np.array_equal(batch["labels"], toks[:, 1:]) and np.array_equal(batch["input_ids"], toks[:, :-1])
    for r in range(n_rows):
        o = owner[4 * r : 4 * r + 4]
        want = [1.0 if o[j + 1] is not None and o[j + 1] == o[j] else 0.0 for j in range(3)]
        assert batch["loss_mask"][r].tolist() == want
    assert batch["loss_mask"][0].tolist() == [1, 1, 0]  # 'a'->'b', 'b'->eos, eos->'c' crosses documents


def test_exact_shard_boundary(tmp_path):
    _write(tmp_path / "in" / "a.txt", "abc")  # 3 bytes + eos = exactly one row of 4 = one shard
    m = prep.prepare(
        [str(tmp_path / "in")], str(tmp_path / "out"), seq_len=3, shard_size=1, eval_fraction=0.0, progress=False
    )
    assert (m["num_rows"], m["num_padding"], m["splits"]["eval"]) == (1, 0, [1, 1])


class _CountingByte(ByteTokenizer):
    calls = 0

    def encode_array(self, text):
        type(self).calls += 1
        return super().encode_array(text)


def _snapshot(out):
    return {
        os.path.relpath(p, out): (open(p, "rb").read(), os.stat(p).st_mtime_ns)
        for p in sorted(glob.glob(os.path.join(out, "**"), recursive=True))
        if os.path.isfile(p) and not p.endswith(".lock")
    }


def test_prepare_is_resumable(tmp_path):
    texts = [f"document {i} " + "xyz" * (i % 7) for i in range(40)]
    inp, out = _jsonl(tmp_path / "in" / "docs.jsonl", texts), str(tmp_path / "out")
    m1 = prep.prepare([inp], out, seq_len=15, shard_size=3, progress=False)
    assert len(m1["shards"]) >= 6
    before = _snapshot(out)
    _CountingByte.calls = 0
    assert prep.prepare([inp], out, seq_len=15, shard_size=3, tokenizer=_CountingByte(), progress=False) == m1
    assert _CountingByte.calls == 0 and _snapshot(out) == before  # no work, files untouched
    # Simulate a crash of the (only) task after shard 2: the manifest, done.json and later shards are missing.
    for p in glob.glob(os.path.join(out, "**"), recursive=True):
        name = os.path.basename(p)
        if name in ("manifest.json", "done.json") or (name.startswith("shard-") and int(name[6:11]) >= 3):
            os.remove(p)
    _CountingByte.calls = 0
    assert prep.prepare([inp], out, seq_len=15, shard_size=3, tokenizer=_CountingByte(), progress=False) == m1
    assert 0 < _CountingByte.calls < len(texts)  # resumed mid-stream
    after = _snapshot(out)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}


# --------------------------------------------------------------------------- errors
def test_bad_inputs_raise_data_error(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no input files"):
        prep.prepare([str(tmp_path / "empty")], str(tmp_path / "o1"), seq_len=8, progress=False)
    _write(tmp_path / "blank" / "a.txt", "  \n")
    with pytest.raises(DataError, match="no documents"):
        prep.prepare([str(tmp_path / "blank")], str(tmp_path / "o2"), seq_len=8, progress=False)
    os.makedirs(tmp_path / "broken")
    os.symlink(tmp_path / "nowhere.txt", tmp_path / "broken" / "a.txt")
    with pytest.raises(DataError, match="cannot read input"):
        prep.prepare([str(tmp_path / "broken")], str(tmp_path / "o3"), seq_len=8, progress=False)
    _write(tmp_path / "badjson" / "a.jsonl", '{"content": "x"}\n')
    with pytest.raises(DataError, match="no string field 'text'"):
        prep.prepare([str(tmp_path / "badjson")], str(tmp_path / "o4"), seq_len=8, progress=False)
    # Token ids >= a forced vocab size.
    tok_path = _hf_tokenizer_file(tmp_path / "tok.json")
    _write(tmp_path / "words" / "a.txt", "hello world")
    with pytest.raises(DataError, match="token id 4 .* vocab_size=4"):
        prep.prepare(
            [str(tmp_path / "words")], str(tmp_path / "o5"), seq_len=8, tokenizer=tok_path, vocab_size=4, progress=False
        )
    # An output dir with another configuration, or foreign files, is never overwritten.
    prep.prepare([str(tmp_path / "words")], str(tmp_path / "o6"), seq_len=8, progress=False)
    with pytest.raises(DataError, match=r"different preparation .*seq_len"):
        prep.prepare([str(tmp_path / "words")], str(tmp_path / "o6"), seq_len=16, progress=False)
    _write(tmp_path / "o7" / "precious.bin", "keep me")
    with pytest.raises(DataError, match="not empty"):
        prep.prepare([str(tmp_path / "words")], str(tmp_path / "o7"), seq_len=8, progress=False)
    # Parquet without pyarrow.
    _write(tmp_path / "pq" / "a.parquet", "")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match="pip install pyarrow"):
        prep.prepare([str(tmp_path / "pq")], str(tmp_path / "o8"), seq_len=8, progress=False)


def test_parquet_input(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "pq")
    pq.write_table(pa.table({"body": ["ab", "c"]}), str(tmp_path / "pq" / "a.parquet"))
    m, toks, _ = (
        prep.prepare([str(tmp_path / "pq")], str(tmp_path / "out"), seq_len=6, text_key="body", progress=False),
        *_all_rows(tmp_path / "out")[1:],
    )
    assert m["num_documents"] == 2 and toks[0].tolist() == [100, 101, 1, 102, 1, 0, 0]


# --------------------------------------------------------------------------- pipeline
@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """Source A holds only 'a' bytes (id 100), source B only 'b' bytes (id 101); ~40 rows each."""
    root = tmp_path_factory.mktemp("sources")
    dirs = []
    for name, ch in (("A", "a"), ("B", "b")):
        inp = _jsonl(root / f"in{name}" / "d.jsonl", [ch * (5 + i % 9) for i in range(60)])
        prep.prepare([inp], str(root / name), seq_len=16, shard_size=7, eval_fraction=0.1, progress=False)
        dirs.append(str(root / name))
    return dirs


def _rows(batch):
    return [tuple(r) for r in batch["input_ids"].tolist()]


def test_restart_from_state_matches_uninterrupted(two_sources):
    it = pipeline.make_train_iterator(two_sources, (0.5, 0.5), seed=3, process_index=0, process_count=1, prefetch=True)
    first = [it.next_batch(4) for _ in range(3)]
    state = json.loads(json.dumps(it.get_state()))
    rest = [it.next_batch(4) for _ in range(4)]
    it.close()
    fresh = pipeline.make_train_iterator(two_sources, (0.5, 0.5), seed=3, process_index=0, process_count=1)
    fresh.set_state(state)
    for want in rest:
        got = fresh.next_batch(4)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    assert {k: (v.shape, v.dtype.name) for k, v in first[0].items()} == {
        "input_ids": ((4, 16), "int32"),
        "labels": ((4, 16), "int32"),
        "loss_mask": ((4, 16), "float32"),
        "segment_ids": ((4, 16), "int32"),
    }
    other = pipeline.make_train_iterator(two_sources, (0.5, 0.5), seed=4, process_index=0, process_count=1)
    with pytest.raises(DataError, match="different sources, weights or seed"):
        other.set_state(state)


def test_mixture_ratio_70_30(two_sources):
    it = pipeline.make_train_iterator(two_sources, (0.7, 0.3), seed=0, process_index=0, process_count=1)
    from_a = 0
    for _ in range(20):
        ids = it.next_batch(50)["input_ids"]
        from_a += int(((ids == 100).any(axis=1)).sum())
        assert not ((ids == 100).any(axis=1) & (ids == 101).any(axis=1)).any()
    assert abs(from_a / 1000 - 0.7) <= 0.02


def test_process_slices_and_elastic_restore(two_sources):
    def make(p, n):
        return pipeline.make_train_iterator(two_sources, seed=1, process_index=p, process_count=n)

    single = make(0, 1)
    g1 = single.next_batch(8)
    pair = [make(0, 2), make(1, 2)]
    slices = [it.next_batch(8) for it in pair]
    assert _rows(slices[0]) + _rows(slices[1]) == _rows(g1)
    # Save at P=1, restore at P=2: the next global batch continues the same sequence.
    state = single.get_state()
    g2 = single.next_batch(8)
    restored = [make(0, 2), make(1, 2)]
    for it in restored:
        it.set_state(state)
    halves = [it.next_batch(8) for it in restored]
    assert _rows(halves[0]) + _rows(halves[1]) == _rows(g2)
    with pytest.raises(DataError, match="multiple of the process count"):
        restored[0].next_batch(3)


def test_batch_size_ramp_neither_repeats_nor_skips(two_sources):
    reference = pipeline.make_train_iterator(two_sources, seed=2, process_index=0, process_count=1)
    want = [r for _ in range(5) for r in _rows(reference.next_batch(4))]
    ramp = pipeline.make_train_iterator(two_sources, seed=2, process_index=0, process_count=1, prefetch=True)
    got = [r for b in (2, 2, 4, 4, 8) for r in _rows(ramp.next_batch(b))]
    ramp.close()
    assert got == want and ramp.get_state()["global_index"] == 20


def test_eval_iterator_is_fixed_order_held_out(two_sources):
    m, toks, _ = _all_rows(two_sources[0])
    start, stop = m["splits"]["eval"]
    it = pipeline.make_eval_iterator(two_sources[:1], process_index=0, process_count=1)
    first = it.next_batch(stop - start)
    assert np.array_equal(first["input_ids"], toks[start:stop, :-1].astype(np.int32))
    it.reset()
    assert np.array_equal(it.next_batch(2)["input_ids"], first["input_ids"][:2])


# --------------------------------------------------------------------------- corpus + config
def test_default_corpus_and_unigram_entropy(tmp_path):
    files = corpus.stdlib_files(max_bytes=60_000)
    assert files == sorted(files, key=lambda f: os.path.relpath(f, corpus.stdlib_dir()))
    assert sum(os.path.getsize(f) for f in files) <= 60_000
    assert not any(part in ("test", "tests") for f in files for part in f.split(os.sep))
    out = str(tmp_path / "corpus")
    m = corpus.prepare_default_corpus(out, seq_len=64, max_bytes=60_000, progress=False)
    assert corpus.prepare_default_corpus(out, seq_len=64, max_bytes=60_000, progress=False) == m
    _, toks, segs = _all_rows(out)
    train = slice(*m["splits"]["train"])
    counts = Counter(toks[train][segs[train] != 0].tolist())
    total = sum(counts.values())
    want = -sum(c / total * math.log(c / total) for c in counts.values())
    assert corpus.unigram_entropy(out) == pytest.approx(want, rel=1e-9)
    assert 1.0 < want < math.log(384)


def test_config_section_and_make_iterators(tmp_path):
    from zaya_jax.config import ConfigError, default_config, validate

    config = validate(default_config())
    config.train.seq_len = 32
    config.data.cache_dir = str(tmp_path / "cache")
    config.data.default_corpus_max_bytes = 40_000
    train, evals, dirs = pipeline.make_iterators(config, process_index=0, process_count=1)
    assert dirs[0].startswith(str(tmp_path / "cache")) and evals is not None
    assert train.next_batch(2)["input_ids"].shape == (2, 32)
    train.close()
    for field, value, match in (
        ("weights", (1.0, 2.0), "one weight per source"),
        ("weights", (-1.0,), "non-negative"),
        ("eval_fraction", 1.5, "eval_fraction"),
    ):
        bad = default_config()
        bad.data[field] = value
        with pytest.raises(ConfigError, match=match):
            validate(bad)
