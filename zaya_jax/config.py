"""Configuration: one `ml_collections.ConfigDict` per component, assembled and validated here.

Each experiment file in `experiments/` exposes `get_config(arg=None)` that starts from
`default_config()` and overrides fields. `validate(config)` runs when a config is loaded
(`load_config`) and raises `ConfigError` with one line naming the field and the fix.
"""

from __future__ import annotations

import importlib.util
import math
import os
import warnings

import ml_collections

SKIP_OUTPUTS = ("scaled_input", "zero")
DISPATCHES = ("auto", "dense", "ragged", "capacity", "grouped", "ep")
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what to do."""


def model_config() -> ml_collections.ConfigDict:
    """ZAYA1 model fields (defaults = the released ZAYA1-base, `zaya1-architecture.md` §1)."""
    return ml_collections.ConfigDict(
        dict(
            vocab_size=262_272,
            hidden_size=2048,
            num_layers=40,  # decoder layers, each = CCA attention + MoE (legacy: 80 half-layers)
            num_q_heads=8,
            num_kv_heads=2,
            head_dim=128,
            cca_time0=2,  # depthwise conv kernel
            cca_time1=2,  # grouped conv kernel
            partial_rotary_factor=0.5,
            rope_theta=1e6,
            max_position_embeddings=32_768,
            rms_norm_eps=1e-5,
            qk_norm_eps=2.0**-7,  # floor of the q/k L2 norm (§9)
            num_experts=16,
            num_experts_per_tok=1,
            moe_intermediate_size=2048,
            router_hidden_size=256,
            skip_output="scaled_input",  # "scaled_input" (legacy training code) | "zero" (HF-native)
            skip_bias_init=-1.0,
            dispatch="auto",  # "auto" (see model/moe.py) | "dense" | "ragged" | "capacity" | "grouped" | "ep"
            capacity_factor=2.0,  # capacity / EP dispatch: slots per expert = cf * tokens / experts
            tie_word_embeddings=True,
            initializer_range=0.02,
            temp_init=1.0,  # key temperature init (§13.3 proposal; HF initialises 0)
            param_dtype="float32",
            dtype="float32",  # compute dtype: "float32" | "bfloat16"
            remat="none",  # "none" | "full" | "dots" | "dots_no_batch"
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        )
    )


CONTEXT_LAYOUTS = ("contiguous", "zigzag")


def mesh_config() -> ml_collections.ConfigDict:
    """Device mesh sizes; -1 fills the remaining devices (at most one axis).

    context_layout: how the sequence is split over `context` (`zaya_jax.parallel.context`): "contiguous"
    (device i holds chunk i) or "zigzag" (2·context chunks, device i holds i and 2·context−1−i: causal
    attention work balanced, half the attention FLOPs).
    """
    return ml_collections.ConfigDict(dict(data=-1, expert=1, context=1, context_layout="contiguous"))


def default_config() -> ml_collections.ConfigDict:
    """The full default tree; components add their own sections via their `default_config()`."""
    from zaya_jax.checkpoint import defaults as checkpoint_defaults
    from zaya_jax.data import defaults as data_defaults
    from zaya_jax.train import defaults as train_defaults

    config = ml_collections.ConfigDict()
    config.model = model_config()
    config.mesh = mesh_config()
    train_defaults.add_to(config)
    data_defaults.add_to(config)
    checkpoint_defaults.add_to(config)
    return config


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_model(m: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for any model field combination the model cannot build."""
    for name in ("vocab_size", "hidden_size", "num_layers", "num_q_heads", "num_kv_heads", "head_dim",
                 "num_experts", "moe_intermediate_size", "router_hidden_size", "cca_time0", "cca_time1"):
        _check(int(m[name]) >= 1, f"model.{name} must be a positive integer, got {m[name]!r}")
    _check(m.num_q_heads % m.num_kv_heads == 0,
           f"model.num_q_heads={m.num_q_heads} must be a multiple of model.num_kv_heads={m.num_kv_heads} "
           "(grouped-query attention)")
    _check(m.head_dim % 2 == 0, f"model.head_dim={m.head_dim} must be even (value heads are split in halves)")
    rot = int(m.head_dim * m.partial_rotary_factor)
    _check(0 < m.partial_rotary_factor <= 1 and rot % 2 == 0,
           f"model.partial_rotary_factor={m.partial_rotary_factor} must give an even number of rotary dims "
           f"(head_dim*factor = {m.head_dim * m.partial_rotary_factor})")
    _check((m.num_kv_heads * m.head_dim) % 2 == 0,
           "model.num_kv_heads*head_dim must be even: the value projection is split into current/delayed halves")
    _check(m.num_experts_per_tok == 1,
           f"model.num_experts_per_tok={m.num_experts_per_tok}: the ZAYA1 router supports top-1 only; set it to 1")
    _check(m.skip_output in SKIP_OUTPUTS, f"model.skip_output={m.skip_output!r}; choose one of {SKIP_OUTPUTS}")
    _check(m.dispatch in DISPATCHES, f"model.dispatch={m.dispatch!r}; choose one of {DISPATCHES}")
    _check(m.capacity_factor > 0, f"model.capacity_factor={m.capacity_factor} must be > 0")
    _check(m.dtype in DTYPES and m.param_dtype in DTYPES,
           f"model.dtype={m.dtype!r} / model.param_dtype={m.param_dtype!r}; choose from {DTYPES}")
    _check(m.remat in REMAT_POLICIES, f"model.remat={m.remat!r}; choose one of {REMAT_POLICIES}")
    _check(bool(m.tie_word_embeddings), "model.tie_word_embeddings must be True: ZAYA1 ties the LM head")
    _check(m.rope_theta > 0 and m.rms_norm_eps > 0 and m.qk_norm_eps > 0,
           "model.rope_theta, model.rms_norm_eps and model.qk_norm_eps must be > 0")


def validate_mesh(config: ml_collections.ConfigDict) -> None:
    sizes = [config.mesh.data, config.mesh.expert, config.mesh.context]
    _check(all(s == -1 or s >= 1 for s in sizes), f"mesh sizes must be >= 1 or -1, got {sizes}")
    _check(sizes.count(-1) <= 1, f"at most one mesh axis may be -1 (fill), got data/expert/context={sizes}")
    if config.mesh.expert > 1:
        _check(config.model.num_experts % config.mesh.expert == 0,
               f"model.num_experts={config.model.num_experts} is not divisible by mesh.expert={config.mesh.expert}")
    layout = config.mesh.get("context_layout", "contiguous")
    _check(layout in CONTEXT_LAYOUTS, f"mesh.context_layout={layout!r}; choose one of {CONTEXT_LAYOUTS}")
    if config.mesh.context > 1:
        from zaya_jax.parallel.mesh import check_sequence_split

        check_sequence_split(config, int(config.mesh.context))


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Validate a full config tree in place and return it."""
    validate_model(config.model)
    if "mesh" in config:
        validate_mesh(config)
    if "train" in config:
        from zaya_jax.train import defaults as train_defaults

        train_defaults.validate(config)
    if "data" in config:
        from zaya_jax.data import defaults as data_defaults

        data_defaults.validate(config)
    _warn_sizing(config.model)
    return config


SIZING_MIN_HIDDEN = 512  # smaller models are CPU / debugging sizes: not meant to be sized for MI300X


def _warn_sizing(m: ml_collections.ConfigDict) -> None:
    """Warn (never fail) on MI300X sizing-rule violations; `launch.check_sizing` gives details (and checks
    models of any size; below SIZING_MIN_HIDDEN load-time warnings would only be noise)."""
    if m.hidden_size < SIZING_MIN_HIDDEN:
        return
    try:
        from zaya_jax import sizing
    except ImportError:  # pragma: no cover - sizing is part of the package
        return
    for violation in sizing.check_model(m):
        warnings.warn(f"sizing: {violation}", stacklevel=3)


CONFIGS = "experiments"  # where the experiment configs live in a checkout (and as zaya_jax/experiments installed)


def installed_configs_dir() -> str | None:
    """The experiment configs shipped with the package: `zaya_jax/experiments/` of an installed package (setup.cfg
    maps the checkout's `experiments/` there), else the checkout's `experiments/`."""
    package = os.path.dirname(os.path.abspath(__file__))
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
    """Load `get_config(arg)` from a Python config file (the big_vision / config_flags convention); `path` may
    carry `:arg` and is looked up with `resolve_config_path`."""
    path = resolve_config_path(path)
    if ":" in path and not os.path.exists(path):
        path, arg = path.split(":", 1)
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist; pass e.g. experiments/zaya1_tiny.py")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg is not None else module.get_config()
    return validate(config)


def num_rotary_dims(m: ml_collections.ConfigDict) -> int:
    return int(m.head_dim * m.partial_rotary_factor)


def round_up(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)
