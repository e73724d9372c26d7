"""`validate_numbers(config)`: every number of a config tree finite, and the ones with a physical range in it.

Run first by `validate`, so a NaN learning rate or a negative one stops with one line naming the field
before anything is compiled (instead of gradient ascent, or a non-finite loss at step 2). Ranges of
structural fields (sizes, steps, batch) are checked by the section validators next to this module.
"""

from __future__ import annotations

import math
from typing import Iterator

import ml_collections

from zaya_jax.config.errors import ConfigError

INF = math.inf
# (section, field) -> (low, high, low_inclusive, high_inclusive)
RANGES: dict[tuple[str, str], tuple[float, float, bool, bool]] = {
    ("optimizer", "learning_rate"): (0.0, INF, True, False),
    ("optimizer", "adam_learning_rate"): (0.0, INF, True, False),
    ("optimizer", "adam_b1"): (0.0, 1.0, True, False),
    ("optimizer", "adam_b2"): (0.0, 1.0, True, False),
    ("optimizer", "adam_eps"): (0.0, INF, False, False),
    ("optimizer", "weight_decay"): (0.0, INF, True, False),
    ("optimizer", "muon_momentum"): (0.0, 1.0, True, False),
    ("optimizer", "muon_ns_steps"): (0.0, INF, True, False),
    ("optimizer", "muon_consistent_rms"): (0.0, INF, True, False),
    ("optimizer", "grad_clip_norm"): (0.0, INF, True, False),
    ("optimizer", "min_lr_ratio"): (0.0, 1.0, True, True),
    ("model", "initializer_range"): (0.0, INF, True, False),
    ("train", "z_loss"): (0.0, INF, True, False),
    ("train", "seed"): (0.0, INF, True, False),
    ("balancing", "warn_cv"): (0.0, INF, True, False),
    ("balancing", "warn_dropped"): (0.0, 1.0, True, True),
}


def numbers(tree: ml_collections.ConfigDict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted name, value) of every int / float leaf of `tree`, inside tuples and lists too (bools excluded)."""
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            yield from numbers(value, name + ".")
        elif isinstance(value, (tuple, list)):
            for item in _flatten(value):
                yield name, item
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, value


def _flatten(items) -> Iterator[float]:
    for item in items:
        if isinstance(item, (tuple, list)):
            yield from _flatten(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            yield item


def _interval(low: float, high: float, low_in: bool, high_in: bool) -> str:
    if high == INF:
        return f"{'>=' if low_in else '>'} {low:g}"
    return f"in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def validate_numbers(config: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for a non-finite number anywhere in `config`, or a field of RANGES outside its range."""
    for name, value in numbers(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}={value} must be a finite number")
    for (section, field), (low, high, low_in, high_in) in RANGES.items():
        if section not in config or field not in config[section]:
            continue
        value = float(config[section][field])
        above = value >= low if low_in else value > low
        below = value <= high if high_in else value < high
        if not (above and below):
            raise ConfigError(
                f"{section}.{field}={config[section][field]} must be {_interval(low, high, low_in, high_in)}"
            )
