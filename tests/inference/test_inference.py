"""Cached generation and evaluation (`zaya_jax.inference`) on a random tiny ZAYA1 built with `transformers`.

The HF model gets every constant-initialised tensor randomised (key temperatures, norms, residual scales,
biases, EDA scales) and router weights / balancing biases that make routing vary and reach the skip slot,
then goes through `save_pretrained` → `zaya_jax.hf.load_pretrained` (fp32). References: the model's own
full forward (decode parity), `transformers` greedy `generate` (generation parity), NumPy (bits per byte,
multiple-choice scores; the top-k / top-p filters are in tests/inference/test_sampling_filters.py, which
needs no torch). Spec: docs/architecture.md §5, §7, §8.

Shapes are shared between tests so each jitted function compiles once: full forwards [1, 16]; decode steps
with a [B=1, T_max=16] cache; `generate` on [3, 7] prompts; evaluation batches [3, 16].
"""

from __future__ import annotations

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.reference  # needs the `reference` extra (torch, transformers)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from experiments import zaya1  # noqa: E402
from zaya_jax import hf  # noqa: E402
from zaya_jax.data import pipeline  # noqa: E402
from zaya_jax.data.prepare import prepare  # noqa: E402
from zaya_jax.data.tokenizer import ByteTokenizer  # noqa: E402
from zaya_jax.inference import decode_step, generate, init_cache, left_pad, prefill  # noqa: E402
from zaya_jax.inference import evaluate as ev  # noqa: E402

# the tiny variant's geometry (experiments/zaya1.py), HF-native names
TINY = zaya1.GEOMETRY["tiny"]
HF_CONFIG = dict(
    vocab_size=TINY.vocab_size,
    hidden_size=TINY.hidden_size,
    num_hidden_layers=TINY.num_layers,
    num_attention_heads=TINY.num_q_heads,
    num_key_value_heads=TINY.num_kv_heads,
    head_dim=TINY.head_dim,
    moe_intermediate_size=TINY.moe_intermediate_size,
    num_experts=TINY.num_experts,
    router_hidden_size=TINY.router_hidden_size,
    max_position_embeddings=TINY.max_position_embeddings,
    initializer_range=0.1,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
)
SEQ, T_MAX, NEW = 16, 16, 8
REL_TOL = 1e-5


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def build_hf(seed: int = 0):
    """Random fp32 `ZayaForCausalLM` with non-trivial constants and varied routing (incl. the skip slot)."""
    torch.manual_seed(seed)
    model = transformers.ZayaForCausalLM(transformers.ZayaConfig(**HF_CONFIG)).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    randn = lambda shape: torch.randn(shape, generator=g)  # noqa: E731
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("qk_norm.temp"):
                p.copy_(0.5 + 2.0 * torch.rand(p.shape, generator=g))
            elif re.search(r"(norm\.weight|_scale)$", name):
                p.copy_(1.0 + 0.2 * randn(p.shape))
            elif re.search(r"(hidden_states_bias|residual_bias)$", name):  # small: keeps greedy output varied
                p.copy_(0.01 * randn(p.shape))
            elif re.search(r"(\.bias|_bias)$", name):
                p.copy_(0.1 * randn(p.shape))
            elif re.search(r"router_mlp\.(fc1|fc2|out_proj)\.weight$", name):
                p.copy_(0.5 * randn(p.shape))
        for name, b in model.named_buffers():
            if name.endswith("balancing_biases"):
                b.copy_(0.02 * randn(b.shape))
                b[-1] += 0.15  # the skip slot wins for some tokens
    model.generation_config.eos_token_id = None  # fixed-length greedy continuations
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model = build_hf()
    path = str(tmp_path_factory.mktemp("hf_tiny"))
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def models(hf_dir):
    """skip_output → JAX model loaded from the HF directory (dropless dispatch, fp32)."""
    _, path = hf_dir
    return {mode: hf.load_pretrained(path, skip_output=mode)[1] for mode in ("zero", "scaled_input")}


@pytest.fixture(scope="module")
def forward():
    """A jitted full forward (the reference for cached decoding): model, ids → (logits, stats)."""
    return jax.jit(lambda model, ids: tuple(model.forward(ids)))


def prompt_ids(batch: int, length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 259, size=(batch, length), dtype=np.int32)


# ----------------------------------------------------------------------------- (1) decode == full forward
@pytest.mark.parametrize("mode", ["zero", "scaled_input"])
def test_decode_matches_full_forward(models, forward, mode):
    model = models[mode]
    ids = prompt_ids(1, SEQ, seed=1)
    full, stats = forward(model, jnp.asarray(ids))
    full = np.asarray(full)
    counts = np.asarray(stats.counts)  # [L, E+1]
    e = model.cfg.num_experts
    assert counts[:, e].sum() > 0, f"the skip slot is never chosen: {counts}"
    assert (counts[:, :e] > 0).sum() >= 3, f"routing does not vary: {counts}"

    cache, steps = init_cache(model.cfg, 1, T_MAX), []
    for t in range(SEQ):  # token by token from an empty cache
        logits, cache = decode_step(model, cache, ids[:, t])
        steps.append(np.asarray(logits))
    err = rel_err(np.stack(steps, axis=1), full)
    assert err <= REL_TOL, f"token-by-token decode vs full forward: rel err {err:.2e}"
    assert int(cache.length) == SEQ

    if mode == "zero":  # prefill a chunk (halo + value shift across the chunk boundary), then decode
        logits, cache = prefill(model, ids[:, :5], T_MAX)
        steps = [np.asarray(logits)]
        for t in range(5, SEQ):
            logits, cache = decode_step(model, cache, ids[:, t])
            steps.append(np.asarray(logits)[:, None])
        err = rel_err(np.concatenate(steps, axis=1), full)
        assert err <= REL_TOL, f"prefill(5) + decode vs full forward: rel err {err:.2e}"


# ----------------------------------------------------------------------------- (2)–(4) generation
def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation of one unpadded prompt, fed token by token through `decode_step` (B = 1)."""
    cache = init_cache(model.cfg, 1, T_MAX)
    for tok in prompt:
        logits, cache = decode_step(model, cache, np.asarray([tok]))
    out = []
    for _ in range(n):
        out.append(int(np.argmax(np.asarray(logits)[0])))
        logits, cache = decode_step(model, cache, np.asarray([out[-1]]))
    return out


def test_greedy_matches_transformers(hf_dir, models):
    hf_model, _ = hf_dir
    ids = prompt_ids(3, 7, seed=2)
    with torch.no_grad():
        ids_t = torch.tensor(ids, dtype=torch.long)
        ref = hf_model.generate(
            ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=NEW, do_sample=False, pad_token_id=0
        ).numpy()
    out = np.asarray(generate(models["zero"], ids, max_new_tokens=NEW))
    assert out.shape == (3, 7 + NEW)
    np.testing.assert_array_equal(out, ref)
    assert len(set(out[:, 7:].ravel().tolist())) > 3, "degenerate continuations make a weak test"


def test_left_padding_matches_alone(models):
    model = models["zero"]
    full = prompt_ids(3, 7, seed=3)
    prompts = [full[0].tolist(), full[1, :4].tolist(), full[2, :6].tolist()]  # pad counts 0, 3, 1
    ids, lengths = left_pad(prompts, pad_id=0)
    assert ids.shape == (3, 7) and lengths.tolist() == [7, 4, 6]
    by_lengths = np.asarray(generate(model, ids, max_new_tokens=NEW, prompt_lengths=lengths))
    by_pad_id = np.asarray(generate(model, ids, max_new_tokens=NEW, pad_id=0))
    np.testing.assert_array_equal(by_lengths, by_pad_id)
    np.testing.assert_array_equal(by_lengths[:, :7], ids)
    for row, prompt in enumerate(prompts):
        assert by_lengths[row, 7:].tolist() == greedy_alone(model, prompt, NEW), f"row {row}"


def test_sampling_filters_and_eos(models):
    model = models["zero"]
    ids = prompt_ids(3, 7, seed=2)
    greedy = np.asarray(generate(model, ids, max_new_tokens=NEW))
    top1 = np.asarray(generate(model, ids, max_new_tokens=NEW, temperature=0.7, top_k=1, seed=3))
    tiny_p = np.asarray(generate(model, ids, max_new_tokens=NEW, temperature=1.3, top_p=1e-6, seed=4))
    np.testing.assert_array_equal(top1, greedy)
    np.testing.assert_array_equal(tiny_p, greedy)
    a = np.asarray(generate(model, ids, max_new_tokens=NEW, temperature=1.0, seed=5))
    b = np.asarray(generate(model, ids, max_new_tokens=NEW, temperature=1.0, seed=5))
    c = np.asarray(generate(model, ids, max_new_tokens=NEW, temperature=5.0, seed=6))
    np.testing.assert_array_equal(a, b)  # seeded
    assert not np.array_equal(c, greedy), "hot sampling reproduced greedy decoding"
    # eos: the row that emits it stops and pads; the loop runs on for the others
    eos = int(greedy[0, 7 + 2])
    stopped = np.asarray(generate(model, ids, max_new_tokens=NEW, eos_id=eos, pad_id=0))
    for row in range(3):
        hits = np.flatnonzero(greedy[row, 7:] == eos)
        cut = 7 + (hits[0] + 1 if hits.size else NEW)
        np.testing.assert_array_equal(stopped[row, :cut], greedy[row, :cut])
        assert (stopped[row, cut:] == 0).all()


# ----------------------------------------------------------------------------- (5) evaluation
@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    texts = [
        "The quick brown fox jumps over the lazy dog. " * 3,
        "Grüße aus Köln — naïve café ☕ " * 4,
        "def f(x):\n    return x * 2\n" * 3,
        "Ελληνικά και 日本語のテキスト " * 2,
    ]
    for i, text in enumerate(texts):
        (root / f"doc{i}.txt").write_text(text, encoding="utf-8")
    out = str(root / "prepared")
    manifest = prepare([str(root)], out, seq_len=SEQ, tokenizer="byte", shard_size=8, eval_fraction=0.4, progress=False)
    return out, manifest


def test_bits_per_byte_numpy(models, forward, prepared):
    model = models["zero"]
    out_dir, manifest = prepared
    result = ev.evaluate_loss(model, [out_dir], batch_size=3)
    # independent reference: every eval row, one at a time, NumPy log-softmax of the model's logits
    src = pipeline.PackedSource(out_dir, "eval")
    nats, nbytes, ntok = 0.0, 0, 0
    for i in range(len(src)):
        row, seg = src[i]["tokens"], src[i]["segment_ids"]
        logits = np.asarray(forward(model, jnp.asarray(row[None, :-1]))[0], np.float64)[0]
        logz = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
        logp = logits[np.arange(SEQ), row[1:]] - logz
        mask = (seg[1:] != 0) & (seg[1:] == seg[:-1])
        nats -= float(np.sum(logp[mask]))
        ntok += int(mask.sum())
        labels = row[1:][mask]
        nbytes += int(np.sum((labels >= 3) & (labels <= 258)))
    assert result["rows"] == len(src) >= 3 and result["tokens"] == ntok and result["bytes"] == nbytes
    assert nbytes < ntok  # eos labels count zero bytes
    assert abs(result["bits_per_byte"] - nats / math.log(2) / nbytes) <= 1e-5 * result["bits_per_byte"]
    assert abs(result["loss"] - nats / ntok) <= 1e-5 * result["loss"]


def test_multiple_choice_numpy(models, forward, tmp_path):
    model, tok = models["zero"], ByteTokenizer()
    items = [
        dict(context="The cat sat", choices=[" on", " by", " at"]),
        dict(context="Once upon", choices=[" a", " tim", " x"]),
    ]

    def reference(context: str, choice: str) -> float:
        seq = [tok.eos_id] + tok.encode(context) + tok.encode(choice)
        ids = np.zeros((1, SEQ), np.int32)
        ids[0, : len(seq)] = seq
        logits = np.asarray(forward(model, jnp.asarray(ids))[0], np.float64)[0]
        logp = logits - (np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1))[:, None]
        start = len(seq) - len(tok.encode(choice))
        return float(sum(logp[t - 1, seq[t]] for t in range(start, len(seq))))

    ref = [[reference(it["context"], c) for c in it["choices"]] for it in items]
    items[0]["answer"] = int(np.argmax(ref[0]))  # the model's pick
    items[1]["answer"] = int(np.argmin(ref[1]))  # the model's worst choice
    norm_picks = [int(np.argmax(np.asarray(r) / [len(c.encode()) for c in it["choices"]])) for r, it in zip(ref, items)]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    result = ev.evaluate_mc(model, tok, ev.load_mc(str(path)))
    np.testing.assert_allclose(np.asarray(result["scores"][0]), ref[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(result["scores"][1]), ref[1], rtol=1e-5)
    assert result["items"] == 2 and result["accuracy"] == 0.5
    assert result["accuracy_norm"] == np.mean([p == it["answer"] for p, it in zip(norm_picks, items)])
