"""Default `config.data` section and its validation.

`zaya_jax.config.default_config` calls `add_to(config)`; `validate(config)` raises
`zaya_jax.config.ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import ml_collections

from zaya_jax.data.corpus import DEFAULT_MAX_BYTES


def add_to(config: ml_collections.ConfigDict) -> None:
    """Add `config.data`."""
    config.data = ml_collections.ConfigDict(
        dict(
            # prepared directories (launch/prepare_data.py); empty = the embedded default corpus
            # (the Python standard library sources), prepared on first use under `cache_dir`
            sources=(),
            weights=(),  # mixture weights, one per source; empty = uniform
            tokenizer="byte",  # "byte" or a local tokenizer.json (default corpus only)
            default_corpus_max_bytes=DEFAULT_MAX_BYTES,
            cache_dir="~/.cache/zaya_jax",
            eval_fraction=0.02,  # held-out rows of the default corpus
            shuffle_seed=0,
            prefetch=True,  # build the next batch in a background thread
        )
    )


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for invalid `config.data` values."""
    from zaya_jax.config import ConfigError

    d = config.data
    sources, weights = tuple(d.sources), tuple(d.weights)
    if not all(isinstance(s, str) and s for s in sources):
        raise ConfigError(f"data.sources={sources!r} must be a tuple of prepared directory paths")
    n = max(len(sources), 1)
    if weights and len(weights) != n:
        raise ConfigError(f"data.weights has {len(weights)} entries but there are {n} sources; "
                          "give one weight per source or leave it empty for uniform")
    if weights and (min(weights) < 0 or sum(weights) <= 0):
        raise ConfigError(f"data.weights={weights!r} must be non-negative with a positive sum")
    if not isinstance(d.tokenizer, str) or not d.tokenizer:
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}; use 'byte' or a path to a tokenizer.json")
    if int(d.default_corpus_max_bytes) <= 0:
        raise ConfigError(f"data.default_corpus_max_bytes={d.default_corpus_max_bytes} must be > 0")
    if not 0.0 <= float(d.eval_fraction) < 1.0:
        raise ConfigError(f"data.eval_fraction={d.eval_fraction} must be in [0, 1)")
    if int(d.shuffle_seed) < 0:
        raise ConfigError(f"data.shuffle_seed={d.shuffle_seed} must be >= 0")
