"""Cached generation: prefill + a jitted `jax.lax.while_loop` over new tokens, greedy / temperature /
top-k / top-p sampling with seeded `jax.random`, batches of left-padded prompts.

    ids = generate(model, prompt_ids, max_new_tokens=32)                         # greedy
    ids = generate(model, prompt_ids, max_new_tokens=32, temperature=0.8, top_p=0.9, seed=1, pad_id=0)

Step API (tests, custom loops): `prefill(model, ids, max_len)` → (logits [B, S, V], cache) and
`decode_step(model, cache, tokens [B])` → (logits [B, V], cache). The cache layout is described in
`zaya_jax.inference.cache`. Spec: docs/architecture.md §2, §5.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zaya_jax.inference.cache import DecodeCache, dropless, extend, init_cache
from zaya_jax.model.layers import lead
from zaya_jax.model.zaya import Zaya


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists → (ids int32 [B, P] left-padded with pad_id, lengths int32 [B]); P = longest prompt."""
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    ids = np.full((len(prompts), int(lengths.max(initial=1))), pad_id, np.int32)
    for row, p in enumerate(prompts):
        if len(p):
            ids[row, ids.shape[1] - len(p) :] = np.asarray(p, np.int32)
    return ids, lengths


def pad_counts(prompt_ids: np.ndarray, prompt_lengths=None, pad_id: int | None = None) -> np.ndarray:
    """Left-padding count per row [B] int32: P − prompt_lengths, else the leading run of pad_id, else 0."""
    b, p = prompt_ids.shape
    if prompt_lengths is not None:
        lengths = np.asarray(prompt_lengths, np.int64).reshape(b)
        if lengths.min(initial=0) < 0 or lengths.max(initial=0) > p:
            raise ValueError(f"prompt_lengths {lengths.tolist()} must lie in [0, {p}]")
        return (p - lengths).astype(np.int32)
    if pad_id is None:
        return np.zeros((b,), np.int32)
    is_pad = np.asarray(prompt_ids) == pad_id
    return np.where(is_pad.all(axis=1), p, np.argmin(is_pad, axis=1)).astype(np.int32)


def filter_logits(
    logits: jax.Array, temperature: jax.Array | float, top_k: jax.Array | int = 0, top_p: jax.Array | float = 1.0
) -> jax.Array:
    """logits [B, V] → logits / temperature with every token outside the top-k / top-p set at −inf.

    top_k > 0 keeps the k largest logits; top_p < 1 then keeps the smallest set of most likely tokens (of
    the renormalised top-k distribution) whose probability reaches top_p; the most likely token is always
    kept, tokens tied with the last kept one are kept too. All arguments may be traced.
    """
    logits = logits.astype(jnp.float32) / temperature
    vocab = logits.shape[-1]
    srt = jnp.sort(logits, axis=-1)[..., ::-1]  # descending
    rank = lead(jnp.arange(vocab), logits.ndim)  # [1.., V]: explicit broadcast over the batch
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    in_k = rank < k
    probs = jax.nn.softmax(jnp.where(in_k, srt, -jnp.inf), axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
    keep = in_k & ((before < top_p) | (top_p >= 1.0) | (rank == 0))
    threshold = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def sample_logits(
    logits: jax.Array,
    key: jax.Array,
    temperature: jax.Array | float = 0.0,
    top_k: jax.Array | int = 0,
    top_p: jax.Array | float = 1.0,
) -> jax.Array:
    """Next tokens [B] int32 from logits [B, V] (fp32); arguments may be traced (one compile for all modes).

    temperature <= 0: greedy argmax (ties → lowest id). Otherwise a draw from softmax(logits / temperature)
    restricted by `filter_logits` (top_k = 0 / top_p = 1 disable the filters); HF's order: temperature,
    top-k, top-p.
    """
    temperature = jnp.asarray(temperature, jnp.float32)

    def sampled(logits):
        filtered = filter_logits(logits, jnp.maximum(temperature, 1e-6), top_k, top_p)
        return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)

    def greedy(logits):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return jax.lax.cond(temperature <= 0, greedy, sampled, logits.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len", "last_only"))
def _prefill(graphdef, state, ids, start, *, max_len: int, last_only: bool):
    model = nnx.merge(graphdef, state)
    cache = init_cache(model.cfg, ids.shape[0], max_len, start)
    return extend(model, cache, ids, last_only=last_only)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _decode_step(graphdef, state, cache, tokens):
    logits, cache = extend(nnx.merge(graphdef, state), cache, tokens[:, None])
    return logits[:, 0], cache


def prefill(
    model: Zaya, ids: jax.Array, max_len: int, *, start: jax.Array | None = None, last_only: bool = False
) -> tuple[jax.Array, DecodeCache]:
    """Run the prompt ids [B, S] through a fresh cache of `max_len` slots (jitted).

    start: [B] left-pad counts (None = none). Returns (logits fp32 [B, S or 1, V], cache with length S).
    """
    if ids.shape[1] > max_len:
        raise ValueError(f"prompt length {ids.shape[1]} exceeds the cache length max_len={max_len}")
    graphdef, state = nnx.split(dropless(model))
    start = jnp.zeros((ids.shape[0],), jnp.int32) if start is None else jnp.asarray(start, jnp.int32)
    return _prefill(graphdef, state, jnp.asarray(ids, jnp.int32), start, max_len=max_len, last_only=last_only)


def decode_step(model: Zaya, cache: DecodeCache, tokens: jax.Array) -> tuple[jax.Array, DecodeCache]:
    """Feed one token per row, tokens [B] int, at slot `cache.length` (jitted). → (logits fp32 [B, V], cache)."""
    if int(cache.length) >= cache.max_len:
        raise ValueError(f"the cache is full (max_len={cache.max_len})")
    graphdef, state = nnx.split(dropless(model))
    return _decode_step(graphdef, state, cache, jnp.asarray(tokens, jnp.int32))


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def _generate(
    graphdef, state, prompt_ids, start, key, temperature, top_k, top_p, eos_id, fill_id, *, max_new_tokens: int
):
    """prompt_ids [B, P] → new tokens [B, max_new_tokens] (see `generate`)."""
    model = nnx.merge(graphdef, state)
    b, p = prompt_ids.shape
    cache = init_cache(model.cfg, b, p + max_new_tokens, start)
    logits, cache = extend(model, cache, prompt_ids, last_only=True)
    sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
    tok = sample(logits[:, 0], jax.random.fold_in(key, 0))
    out = jnp.full((b, max_new_tokens), fill_id, jnp.int32).at[:, 0].set(tok)
    done = tok == eos_id  # eos_id = -1 disables stopping

    def cond(carry):
        step, _, _, _, done = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, cache, tok, out, done = carry
        logits, cache = extend(model, cache, tok[:, None])
        nxt = sample(logits[:, 0], jax.random.fold_in(key, step))
        nxt = jnp.where(done, fill_id, nxt)
        out = jax.lax.dynamic_update_slice_in_dim(out, nxt[:, None], step, axis=1)
        return step + 1, cache, nxt, out, done | (nxt == eos_id)

    carry = (jnp.ones((), jnp.int32), cache, tok, out, done)
    return jax.lax.while_loop(cond, body, carry)[3]


def trace_generate(graphdef, state, prompt_ids, max_new_tokens: int):
    """The jitted generation program of `generate` traced on (possibly abstract) model `state` and prompt ids
    [B, P], greedy with no stop token: `.lower(lowering_platforms=...)` builds it for another platform."""
    b = prompt_ids.shape[0]
    scalars = (jnp.float32(0.0), jnp.int32(0), jnp.float32(1.0), jnp.int32(-1), jnp.int32(0))  # T, top-k/p, eos, fill
    start, key = jnp.zeros((b,), jnp.int32), jax.random.PRNGKey(0)
    return _generate.trace(graphdef, state, prompt_ids, start, key, *scalars, max_new_tokens=max_new_tokens)


def generate(
    model: Zaya,
    prompt_ids,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    prompt_lengths=None,
    pad_id: int | None = None,
    eos_id: int | None = None,
) -> jax.Array:
    """Generate `max_new_tokens` tokens after each prompt with the KV/conv cache.

    prompt_ids: [B, P] int, left-padded when prompts differ in length; the real tokens of row b are the
    last prompt_lengths[b] (or, without prompt_lengths, those after the leading run of pad_id). A padded
    prompt gives the same continuation as the same prompt alone (positions, conv halo and value shift start
    at its first real token; pad keys are masked). temperature 0 = greedy; otherwise sampling with
    optional top_k (> 0) and top_p (< 1) filters, seeded by `seed`. eos_id: rows that emit it stop, later
    slots hold pad_id (or eos_id when pad_id is None); the loop ends early when every row has stopped.
    Returns [B, P + max_new_tokens] int32: the prompt ids as given followed by the new ids.
    """
    prompt = np.asarray(prompt_ids, np.int32)
    if prompt.ndim != 2:
        raise ValueError(f"prompt_ids must be [batch, prompt_len], got shape {prompt.shape}")
    if max_new_tokens < 0 or temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(
            f"need max_new_tokens >= 0, temperature >= 0, top_k >= 0, 0 < top_p <= 1; got "
            f"{max_new_tokens}, {temperature}, {top_k}, {top_p}"
        )
    if max_new_tokens == 0:
        return jnp.asarray(prompt)
    if prompt.shape[1] == 0:
        raise ValueError("empty prompts: give at least one token (e.g. bos) per row")
    start = pad_counts(prompt, prompt_lengths, pad_id)
    graphdef, state = nnx.split(dropless(model))
    stop = eos_id is not None
    fill = pad_id if pad_id is not None else (eos_id if stop else 0)
    new = _generate(
        graphdef,
        state,
        jnp.asarray(prompt),
        jnp.asarray(start),
        jax.random.PRNGKey(seed),
        jnp.float32(temperature),
        jnp.int32(top_k),
        jnp.float32(top_p),
        jnp.int32(eos_id if stop else -1),
        jnp.int32(fill),
        max_new_tokens=int(max_new_tokens),
    )
    return jnp.concatenate([jnp.asarray(prompt), new], axis=1)
