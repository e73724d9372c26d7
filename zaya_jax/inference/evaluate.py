"""Evaluation: held-out loss and bits per byte on prepared data, multiple-choice log-likelihood scoring.

* `evaluate_loss(model, dirs)`: every row of the eval splits of prepared directories (in order, once),
  scored with the batch `loss_mask`. bits/byte = Σ nats / ln 2 / Σ UTF-8 bytes of the scored label tokens.
  Byte tokenizer: ids 3..258 are one byte each, special ids (pad / eos / bos) zero. Other tokenizers: each
  token is decoded on its own (special tokens decode to "", zero bytes) and its UTF-8 length counted.
* `evaluate_mc(model, tokenizer, items)`: items `{"context": str, "choices": [str, ...], "answer": int}`;
  the score of a choice is Σ log p(continuation tokens | prefix, context); accuracy takes the argmax of the
  score, length-normalised accuracy the argmax of score / UTF-8 bytes of the choice.

The model runs with a dropless MoE dispatch (`cache.dropless`), so scores do not depend on batch
composition or padding. Spec: docs/architecture.md §2, §8 (fp32 logits).
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zaya_jax.data import pipeline
from zaya_jax.data import prepare as data_prepare
from zaya_jax.data.inputs import jsonl_records
from zaya_jax.data.tokenizer import ByteTokenizer, DataError, Tokenizer, load_tokenizer
from zaya_jax.inference.cache import dropless
from zaya_jax.model.zaya import Zaya

LOGIT_CHUNK = 1024  # tokens per head/log-softmax chunk: [chunk, V] fp32 logits at a time


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def _token_logprobs(graphdef, state, input_ids, labels, *, chunk: int):
    model = nnx.merge(graphdef, state)
    h, _ = model.hidden_states(input_ids)
    b, s, hid = h.shape
    n = b * s
    pad = -n % chunk
    hc = jnp.pad(h.reshape(n, hid), ((0, pad), (0, 0))).reshape(-1, chunk, 1, hid)
    lc = jnp.pad(labels.reshape(n), (0, pad)).reshape(-1, chunk)

    def one(args):
        hx, lx = args
        logits = model.logits(hx)[:, 0]  # [chunk, V] fp32 (§8)
        logz = jax.nn.logsumexp(logits, axis=-1)
        return jnp.take_along_axis(logits, lx[:, None], axis=-1)[:, 0] - logz

    return jax.lax.map(one, (hc, lc)).reshape(-1)[:n].reshape(b, s)


def token_logprobs(model: Zaya, input_ids, labels) -> np.ndarray:
    """log p(labels[b, t] | input_ids[b, :t+1]) as fp32 NumPy [B, S].

    One full forward; the tied head and log-softmax run over chunks of `LOGIT_CHUNK` tokens, so the
    [B, S, V] logits are never materialised at once.
    """
    graphdef, state = nnx.split(dropless(model))
    ids = jnp.asarray(input_ids, jnp.int32)
    out = _token_logprobs(
        graphdef, state, ids, jnp.asarray(labels, jnp.int32), chunk=min(LOGIT_CHUNK, ids.shape[0] * ids.shape[1])
    )
    return np.asarray(out, np.float32)


class ByteCounter:
    """UTF-8 bytes per token id: `counter(ids)` → int64 array of ids.shape."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._lengths: dict[int, int] = {}

    def __call__(self, ids) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        if isinstance(self.tokenizer, ByteTokenizer):
            lo = ByteTokenizer.offset
            return ((ids >= lo) & (ids < lo + 256)).astype(np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        for i in uniq.tolist():
            if i not in self._lengths:
                self._lengths[i] = len(self.tokenizer.decode([i]).encode("utf-8"))
        return np.asarray([self._lengths[i] for i in uniq.tolist()], np.int64)[inverse].reshape(ids.shape)


def data_tokenizer(dirs: Sequence[str], tokenizer: "str | Tokenizer | None" = None) -> Tokenizer:
    """The tokenizer that prepared `dirs` (from manifest.json). Byte data needs nothing; data prepared with a
    tokenizer.json needs `tokenizer` (its path; checked against the manifest's sha256) unless the prepared
    directory holds a tokenizer.json."""
    manifests = [data_prepare.load_manifest(d) for d in dirs]
    described = manifests[0]["tokenizer"]
    if any(m["tokenizer"] != described for m in manifests[1:]):
        raise DataError(f"{list(dirs)} were prepared with different tokenizers; evaluate them separately")
    if described.get("kind") == "byte" and tokenizer is None:
        return ByteTokenizer()
    if tokenizer is None:
        local = os.path.join(os.path.expanduser(dirs[0]), "tokenizer.json")
        if not os.path.isfile(local):
            raise DataError(
                f"{dirs[0]} was prepared with tokenizer {described.get('name')!r}; pass its "
                "tokenizer.json (--tokenizer=PATH) to count bytes"
            )
        tokenizer = local
    tok = load_tokenizer(tokenizer)
    want, got = described.get("sha256"), tok.describe().get("sha256")
    if described.get("kind") != tok.describe().get("kind") or (want and got and want != got):
        raise DataError(
            f"tokenizer {tok!r} does not match the one that prepared {dirs[0]} "
            f"({described.get('name')!r}, sha256 {want})"
        )
    return tok


def evaluate_loss(
    model: Zaya,
    dirs: Sequence[str],
    *,
    batch_size: int = 8,
    max_batches: int | None = None,
    tokenizer: "str | Tokenizer | None" = None,
) -> dict:
    """Held-out loss over the eval splits of `dirs`, each row once (single process).

    Returns {"loss": mean nats per scored token, "bits_per_byte", "perplexity", "tokens", "bytes", "nats",
    "rows"}. Partial final batches are padded with masked rows so every batch has one shape.
    """
    tok = data_tokenizer(dirs, tokenizer)
    count_bytes = ByteCounter(tok)
    num_rows = sum(len(s) for s in pipeline.open_sources(dirs, "eval"))
    if max_batches is not None:
        num_rows = min(num_rows, max_batches * batch_size)
    it = pipeline.make_eval_iterator(list(dirs), process_index=0, process_count=1)
    nats, tokens, nbytes, done = 0.0, 0.0, 0, 0
    try:
        while done < num_rows:
            n = min(batch_size, num_rows - done)
            batch = it.next_batch(n)
            ids, labels, mask = (
                np.pad(batch[k], ((0, batch_size - n), (0, 0))) for k in ("input_ids", "labels", "loss_mask")
            )
            logp = token_logprobs(model, ids, labels).astype(np.float64)
            nats -= float(np.sum(logp * mask))
            tokens += float(np.sum(mask))
            nbytes += int(np.sum(count_bytes(labels) * (mask > 0)))
            done += n
    finally:
        it.close()
    loss = nats / max(tokens, 1.0)
    return dict(
        loss=loss,
        perplexity=math.exp(min(loss, 700.0)),
        bits_per_byte=nats / math.log(2) / max(nbytes, 1),
        tokens=int(tokens),
        bytes=nbytes,
        nats=nats,
        rows=done,
    )


def _bucket(n: int, multiple: int = 16) -> int:
    return -(-n // multiple) * multiple


def score_choices(
    model: Zaya, tokenizer: Tokenizer, context: str, choices: Sequence[str], *, prefix_ids: Sequence[int] | None = None
) -> np.ndarray:
    """Σ log p(choice tokens | prefix + context) for each choice → float64 [n_choices].

    Context and choice are tokenized separately (the continuation's tokens are the choice's own). The
    sequence starts with `prefix_ids` (default: [eos], the document boundary of packed training data).
    Sequences are right-padded to a multiple of 16 tokens (causal model, so padding changes nothing).
    """
    prefix = [tokenizer.eos_id] if prefix_ids is None else list(prefix_ids)
    ctx = prefix + list(tokenizer.encode(context))
    conts = [list(tokenizer.encode(c)) for c in choices]
    if not ctx:
        raise DataError("empty context and prefix: nothing to condition on")
    if any(not c for c in conts):
        raise DataError(f"a choice tokenizes to nothing: {list(choices)!r}")
    seqs = [ctx + c for c in conts]
    length = _bucket(max(len(s) for s in seqs))
    ids = np.full((len(seqs), length + 1), tokenizer.pad_id, np.int32)
    weights = np.zeros((len(seqs), length), np.float64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        weights[i, len(ctx) - 1 : len(s) - 1] = 1.0  # label positions of the continuation tokens
    logp = token_logprobs(model, ids[:, :-1], ids[:, 1:]).astype(np.float64)
    return np.sum(logp * weights, axis=1)


def load_mc(path: str) -> list[dict]:
    """Multiple-choice items from a JSONL file (one `{"context", "choices", "answer"}` object per line)."""
    items = []
    for lineno, item in jsonl_records(os.path.expanduser(path)):
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("context"), str)
            and isinstance(item.get("choices"), list)
            and item["choices"]
            and isinstance(item.get("answer"), int)
            and 0 <= item["answer"] < len(item["choices"])
        )
        if not ok:
            raise DataError(
                f"{path}:{lineno}: need {{'context': str, 'choices': [str, ...], 'answer': int "
                f"index into choices}}, got {json.dumps(item)[:200]}"
            )
        items.append(item)
    if not items:
        raise DataError(f"{path}: no items")
    return items


def evaluate_mc(
    model: Zaya, tokenizer: Tokenizer, items: Iterable[dict], *, prefix_ids: Sequence[int] | None = None
) -> dict:
    """Accuracy and length-normalised accuracy (score / UTF-8 bytes of the choice) over `items`.

    Returns {"accuracy", "accuracy_norm", "items", "scores": per item list of per-choice scores}.
    """
    correct = correct_norm = 0
    all_scores = []
    for item in items:
        scores = score_choices(model, tokenizer, item["context"], item["choices"], prefix_ids=prefix_ids)
        nbytes = np.asarray([max(len(c.encode("utf-8")), 1) for c in item["choices"]], np.float64)
        correct += int(np.argmax(scores)) == item["answer"]
        correct_norm += int(np.argmax(scores / nbytes)) == item["answer"]
        all_scores.append(scores.tolist())
    n = len(all_scores)
    return dict(accuracy=correct / max(n, 1), accuracy_norm=correct_norm / max(n, 1), items=n, scores=all_scores)
