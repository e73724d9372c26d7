"""Reading checkpoints outside the training loop: the model for inference/eval, or the full train state
onto any mesh (used by `launch.reshard`).

`path` may be a checkpoint directory (`<dir>/<step>/…`), a step directory (`<dir>/<step>`), or a
training workdir containing `checkpoints/`. The newest committed step is used unless `step` is given.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import ml_collections
from flax import nnx

from zaya_jax.checkpoint.errors import CheckpointConfigError
from zaya_jax.checkpoint.manager import Checkpointer, abstract_target, tree_nbytes
from zaya_jax.config import RENAMED_DISPATCHES, ConfigError, default_config, validate_model
from zaya_jax.model.zaya import abstract_model
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import TrainState, abstract_train_state, split_model


def resolve_checkpoint(path: str, step: int | None = None) -> tuple[str, int]:
    """(checkpoint directory, step) for `path` (see module docstring); raises a one-line CheckpointError."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise CheckpointConfigError(f"checkpoint {path} does not exist")
    if not os.path.isdir(path):
        raise CheckpointConfigError(f"checkpoint {path} is not a directory")
    name, parent = os.path.basename(path.rstrip("/")), os.path.dirname(path.rstrip("/"))
    if name.isdigit() and int(name) in Checkpointer(parent, read_only=True).committed_steps():
        if step is not None and step != int(name):
            raise CheckpointConfigError(f"{path} is step {name} but step={step} was requested")
        return parent, int(name)
    for candidate in (path, os.path.join(path, "checkpoints")):
        if not os.path.isdir(candidate):
            continue
        ck = Checkpointer(candidate, read_only=True)
        steps = ck.committed_steps()
        if steps:
            if step is None:
                return candidate, steps[-1]
            if step not in steps:
                raise CheckpointConfigError(f"{candidate} has no committed step {step}; available: {steps}")
            return candidate, step
        if ck.uncommitted():
            raise CheckpointConfigError(
                f"{candidate} has no committed checkpoint, only interrupted saves {ck.uncommitted()}"
            )
    raise CheckpointConfigError(f"{path} contains no checkpoint (expected <dir>/<step>/ with state and meta)")


def config_from_meta(meta: dict, directory: str = "checkpoint") -> ml_collections.ConfigDict:
    """The training config saved in a checkpoint, on top of the current defaults (new fields keep defaults)."""

    saved = meta.get("config")
    if not isinstance(saved, dict) or "model" not in saved:
        raise CheckpointConfigError(f"{directory}: the checkpoint metadata has no saved config")
    config = default_config()
    with config.unlocked():
        config.update(saved)
    if config.model.dispatch in RENAMED_DISPATCHES:  # saved before `model.kernels`: the same computation
        config.model.kernels.grouped_gemm = RENAMED_DISPATCHES[config.model.dispatch]
        config.model.dispatch = "dropless"
    return config


def open_checkpoint(path: str, step: int | None = None) -> tuple[Checkpointer, int, dict, ml_collections.ConfigDict]:
    """(read-only Checkpointer, step, meta, saved config) for `path`."""
    directory, step = resolve_checkpoint(path, step)
    ck = Checkpointer(directory, read_only=True)
    meta = ck.read_meta(step)
    return ck, step, meta, config_from_meta(meta, f"{directory}/{step}")


def load_model(
    path: str,
    *,
    step: int | None = None,
    dtype: str | None = None,
    overrides: dict[str, Any] | None = None,
    sharding: jax.sharding.Sharding | None = None,
):
    """(config, model) from a training checkpoint: only params and balancing biases are read.

    dtype: "float32" | "bfloat16" for parameters and compute (biases stay fp32); overrides: model-config
    fields (e.g. {"dispatch": "dropless"} for dropless inference). Arrays land on `sharding` (default: the
    first device).
    """

    ck, step, _, config = open_checkpoint(path, step)
    m = config.model
    for name, value in (overrides or {}).items():
        if name not in m:
            raise CheckpointConfigError(f"load_model: unknown model config field {name!r} in overrides")
        m[name] = value
    if dtype is not None:
        m.param_dtype = m.dtype = str(dtype)

    try:
        validate_model(m)
    except ConfigError as err:
        raise CheckpointConfigError(f"load_model: {err}") from err
    graphdef, params, biases = split_model(abstract_model(m))
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    tree = {"params": params, "biases": biases}
    target = abstract_target(tree, jax.tree.map(lambda _: sharding, tree))
    try:
        restored, _ = ck.restore(step, target, partial=True)
    finally:
        ck.close()
    return config, nnx.merge(graphdef, restored["params"], restored["biases"])


def load_train_state(
    path: str,
    mesh: jax.sharding.Mesh,
    *,
    config: ml_collections.ConfigDict | None = None,
    step: int | None = None,
    progress: Callable[[str, int], None] | None = None,
):
    """(config, step, meta, graphdef, state, shardings): the full TrainState restored onto `mesh`.

    `config` (default: the saved one) decides the target shapes, dtypes (cast on restore) and layout
    (`train.param_sharding`). The state is read field by field; `progress(name, nbytes)` is called after each.
    """

    ck, step, meta, saved_config = open_checkpoint(path, step)
    config = config or saved_config
    graphdef, abs_state, shardings = abstract_train_state(config, mesh, make_optimizer(config))
    ck.check_target(step, abs_state)
    fields = {}
    try:
        for name in TrainState._fields:
            part, _ = ck.restore(step, {name: getattr(abs_state, name)}, partial=True)
            fields[name] = part[name]
            if progress is not None:
                progress(name, tree_nbytes(fields[name]))
    finally:
        ck.close()
    return config, step, meta, graphdef, TrainState(**fields), shardings
