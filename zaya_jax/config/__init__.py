"""Configuration: one `ml_collections.ConfigDict` tree, its defaults and its validation — a layer of its own.

This package imports nothing else of `zaya_jax`: every section's defaults and every choice name live in
`defaults.py`, every check in `validate.py`. Experiment files (`experiments/`) expose `get_config(arg=None)`
that starts from `default_config()` and overrides fields; `validate(config)` runs once when a config is
loaded (`load_config`, the launchers) and raises `ConfigError` with one line naming the field and the fix.
Nothing edits a config after it has been validated.
"""

from __future__ import annotations

import importlib.util
import math
import os
from types import ModuleType

import ml_collections

from zaya_jax.config.defaults import (
    CONCRETE_DISPATCHES,
    CONTEXT_CHUNKS,
    CONTEXT_LAYOUTS,
    DECAY_SHAPES,
    DEFAULT_CORPUS_MAX_BYTES,
    DISPATCHES,
    DTYPES,
    ERROR_SHAPES,
    GAIN_UNITS,
    GRAD_REDUCE_DTYPES,
    PARAM_SHARDINGS,
    REMAT_POLICIES,
    SCHEDULES,
    SECTIONS,
    SKIP_OUTPUTS,
    balancing_config,
    checkpoint_config,
    choice_table,
    data_config,
    default_config,
    mesh_config,
    model_config,
    optimizer_config,
    train_config,
)
from zaya_jax.config.validate import (
    ConfigError,
    check_sequence_split,
    validate,
    validate_balancing,
    validate_checkpoint,
    validate_data,
    validate_mesh,
    validate_model,
    validate_optimizer,
    validate_train,
)

__all__ = [
    "CONCRETE_DISPATCHES", "CONTEXT_CHUNKS", "CONTEXT_LAYOUTS", "DECAY_SHAPES", "DEFAULT_CORPUS_MAX_BYTES",
    "DISPATCHES", "DTYPES", "ERROR_SHAPES", "GAIN_UNITS", "GRAD_REDUCE_DTYPES", "PARAM_SHARDINGS", "REMAT_POLICIES",
    "SCHEDULES", "SECTIONS", "SKIP_OUTPUTS", "ConfigError", "balancing_config", "check_sequence_split",
    "checkpoint_config", "choice_table", "config_module", "data_config", "default_config", "load_config",
    "mesh_config", "model_config", "num_rotary_dims", "optimizer_config", "round_up", "train_config", "validate",
    "validate_balancing", "validate_checkpoint", "validate_data", "validate_mesh", "validate_model",
    "validate_optimizer", "validate_train",
]


def config_module(path: str) -> ModuleType:
    """The Python config file at `path`, executed as a module (config files need not be in a package: a file of
    `experiments/` loads its sibling with `config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))`)."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass e.g. experiments/zaya1_tiny.py")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """Load and validate `get_config(arg)` from a Python config file (the big_vision / config_flags convention:
    `path:arg` selects a variant, e.g. `experiments/zaya1.py:tiny`)."""
    if ":" in path and not os.path.exists(path):
        path, arg = path.split(":", 1)
    module = config_module(path)
    config = module.get_config(arg) if arg is not None else module.get_config()
    return validate(config)


def num_rotary_dims(m: ml_collections.ConfigDict) -> int:
    return int(m.head_dim * m.partial_rotary_factor)


def round_up(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)
