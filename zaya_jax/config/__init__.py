"""Configuration: one `ml_collections.ConfigDict` tree, its defaults and its validation — a layer of its own.

This package imports nothing else of `zaya_jax` but the error base class (`zaya_jax.errors`): every section's defaults
and every choice name live in `defaults.py`, every check in `validate.py`. Experiment files (`experiments/`) expose
`get_config(arg=None)` that starts from `default_config()` and overrides fields; `validate(config)` runs once when a
config is loaded (`load_config`, the launchers) and raises `ConfigError` with one line naming the field and the fix.
Nothing edits a config after it has been validated.
"""

from __future__ import annotations

import importlib.util
import math
import os
from types import ModuleType

import ml_collections

from zaya_jax.config.defaults import (
    ATTENTION_KERNELS,
    CONCRETE_DISPATCHES,
    CONTEXT_CHUNKS,
    CONTEXT_LAYOUTS,
    DECAY_SHAPES,
    DEFAULT_CORPUS_MAX_BYTES,
    DISPATCHES,
    DROPLESS_DISPATCHES,
    DTYPES,
    ERROR_SHAPES,
    GAIN_UNITS,
    GEOMETRY_FIELDS,
    GRAD_REDUCE_DTYPES,
    GROUPED_GEMM_KERNELS,
    KERNEL_PLATFORMS,
    MATMUL_KERNELS,
    PARAM_SHARDINGS,
    REMAT_POLICIES,
    RENAMED_DISPATCHES,
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
    "ATTENTION_KERNELS",
    "CONCRETE_DISPATCHES",
    "CONTEXT_CHUNKS",
    "CONTEXT_LAYOUTS",
    "DECAY_SHAPES",
    "DEFAULT_CORPUS_MAX_BYTES",
    "DISPATCHES",
    "DROPLESS_DISPATCHES",
    "DTYPES",
    "ERROR_SHAPES",
    "GAIN_UNITS",
    "GEOMETRY_FIELDS",
    "GRAD_REDUCE_DTYPES",
    "GROUPED_GEMM_KERNELS",
    "KERNEL_PLATFORMS",
    "MATMUL_KERNELS",
    "PARAM_SHARDINGS",
    "REMAT_POLICIES",
    "RENAMED_DISPATCHES",
    "SCHEDULES",
    "SECTIONS",
    "SKIP_OUTPUTS",
    "ConfigError",
    "balancing_config",
    "check_sequence_split",
    "checkpoint_config",
    "choice_table",
    "config_module",
    "installed_configs_dir",
    "resolve_config_path",
    "data_config",
    "default_config",
    "load_config",
    "mesh_config",
    "model_config",
    "num_rotary_dims",
    "optimizer_config",
    "round_up",
    "train_config",
    "validate",
    "validate_balancing",
    "validate_checkpoint",
    "validate_data",
    "validate_mesh",
    "validate_model",
    "validate_optimizer",
    "validate_train",
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


CONFIGS = "experiments"  # where the experiment configs live in a checkout (and as zaya_jax/experiments installed)


def installed_configs_dir() -> str | None:
    """The experiment configs shipped with the package: `zaya_jax/experiments/` of an installed package (setup.py
    maps the checkout's `experiments/` there), else the checkout's `experiments/`."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for directory in (os.path.join(package, CONFIGS), os.path.join(os.path.dirname(package), CONFIGS)):
        if os.path.isdir(directory):
            return directory
    return None


def resolve_config_path(spec: str) -> str:
    """`experiments/NAME.py[:arg]` → the installed copy of NAME.py when the path does not exist relative to the
    working directory (e.g. after `pip install .`, run from another directory); any other spec unchanged."""
    path, sep, arg = spec.partition(":")
    if os.path.exists(spec) or os.path.exists(path) or os.path.isabs(path):
        return spec
    norm = os.path.normpath(path)
    directory = installed_configs_dir()
    if directory is None or not norm.startswith(CONFIGS + os.sep):
        return spec
    candidate = os.path.join(directory, os.path.relpath(norm, CONFIGS))
    return candidate + sep + arg if os.path.exists(candidate) else spec


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """Load and validate `get_config(arg)` from a Python config file (the big_vision / config_flags convention:
    `path:arg` selects a variant, e.g. `experiments/zaya1.py:tiny`); an `experiments/...` path is looked up
    with `resolve_config_path`."""
    path = resolve_config_path(path)
    if ":" in path and not os.path.exists(path):
        path, arg = path.split(":", 1)
    module = config_module(path)
    config = module.get_config(arg) if arg is not None else module.get_config()
    return validate(config)


def num_rotary_dims(m: ml_collections.ConfigDict) -> int:
    return int(m.head_dim * m.partial_rotary_factor)


def round_up(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)
