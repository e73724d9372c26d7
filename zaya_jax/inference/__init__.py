"""Inference: cached generation (prefill + jitted decode loop, sampling, left padding) and evaluation
(held-out loss, bits per byte, multiple-choice log-likelihood scoring).

    from zaya_jax.inference import generate
    ids = generate(model, prompt_ids, max_new_tokens=32, temperature=0.0)   # [B, P + 32]
"""

from zaya_jax.inference.cache import DecodeCache, dropless, extend, init_cache
from zaya_jax.inference.generate import (
    decode_step,
    filter_logits,
    generate,
    left_pad,
    pad_counts,
    prefill,
    sample_logits,
)

__all__ = [
    "DecodeCache",
    "decode_step",
    "dropless",
    "extend",
    "filter_logits",
    "generate",
    "init_cache",
    "left_pad",
    "pad_counts",
    "prefill",
    "sample_logits",
]
