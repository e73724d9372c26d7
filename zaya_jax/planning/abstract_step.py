"""The planned run without hardware: the config set up for planning (mesh, batch per device, dispatch), the
batch as sharded `jax.ShapeDtypeStruct`s, and the train step lowered on the abstract state
(`zaya_jax.train.setup.prepare_abstract`); nothing is allocated (docs/planner.md).
"""

from __future__ import annotations

import copy
import math

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import NamedSharding

from zaya_jax.config import validate_mesh
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES, BATCH_AXES, make_mesh, resolve_mesh_shape
from zaya_jax.train.microbatch import BATCH_KEYS
from zaya_jax.train.schedule import check_layout
from zaya_jax.train.setup import prepare_abstract

# XLA options that only shorten LLVM code generation; HLO passes, buffer assignment and cost analysis are
# unchanged (the planner never runs the program).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def planning_config(
    config: ml_collections.ConfigDict,
    *,
    mesh: dict[str, int] | None = None,
    seq_len: int | None = None,
    batch_per_device: int = 1,
    microbatches: int | None = None,
    remat: str | None = None,
    param_sharding: str | None = None,
    dispatch: str | None = "auto",
    capacity_factor: float | None = None,
    num_devices: int | None = None,
) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A copy of `config` set up for planning, and notes on what was changed.

    The global batch is `batch_per_device` sequences per batch shard (data × expert) per micro-batch.
    dispatch="auto": 'ep' (per-device capacity buffers, sized like a dropless grouped GEMM at cf = 1) unless
    the config uses 'dense'; 'capacity' computes one *global* capacity that GSPMD partitions with
    all-gathers / all-reduces of the whole buffer, and XLA:CPU lowers `ragged_dot` to a dense masked dot (E×).
    """
    cfg, notes = copy.deepcopy(config), []
    with cfg.unlocked():
        m, t = cfg.model, cfg.train
        if mesh is not None:
            for axis in AXES:
                cfg.mesh[axis] = int(mesh.get(axis, 1))
        sizes = resolve_mesh_shape(cfg.mesh, num_devices or jax.device_count())
        for axis, size in sizes.items():
            cfg.mesh[axis] = size
        if seq_len:
            t.seq_len = int(seq_len)
        if microbatches:
            t.microbatches = int(microbatches)
        t.global_batch_size = batch_per_device * math.prod(sizes[a] for a in BATCH_AXES) * t.microbatches
        t.batch_ramp = ()
        if remat:
            m.remat = remat
        if param_sharding:
            t.param_sharding = param_sharding
        if dispatch == "auto":
            dispatch = "dense" if m.dispatch == "dense" else "ep"
        if dispatch and dispatch != m.dispatch:
            notes.append(f"dispatch {m.dispatch!r} -> {dispatch!r} for planning")
            m.dispatch = dispatch
        if capacity_factor and capacity_factor != m.capacity_factor:
            notes.append(f"capacity_factor {m.capacity_factor} -> {capacity_factor} for planning")
            m.capacity_factor = float(capacity_factor)
    validate_mesh(cfg)  # e.g. the sequence must split into equal context-parallel chunks
    check_layout(cfg, sizes)
    return cfg, notes


def ep_ragged_upper_bound(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with an `ep_ragged` dispatch planned as `ep` at the same capacity factor (a copy; other configs as
    they are). XLA:CPU has no ragged all-to-all, and its stand-in exchanges every row padded (n_ep× the bytes);
    `ep` at cf has every device compute and exchange a full receive buffer of cf × its tokens: the most
    `ep_ragged`'s grouped GEMMs and ragged all-to-all do on any device, with the same buffer sizes."""
    if config.model.dispatch != "ep_ragged":
        return config
    config = copy.deepcopy(config)
    with config.unlocked():
        config.model.dispatch = "ep"
    return config


def abstract_batch(config: ml_collections.ConfigDict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    shape = (config.train.global_batch_size, config.train.seq_len)
    spec = NamedSharding(mesh, sharding.batch_spec(2))
    dtypes = {"input_ids": jnp.int32, "labels": jnp.int32, "loss_mask": jnp.float32}
    return {k: jax.ShapeDtypeStruct(shape, dtypes[k], sharding=spec) for k in BATCH_KEYS}


def lower_train_step(config: ml_collections.ConfigDict, devices: list | None = None, platform: str | None = None):
    """The train step of `config` (`zaya_jax.train.setup.prepare_abstract`) lowered on abstract state and batch →
    (lowered, mesh, the abstract `Training`). platform: lower for that platform ("rocm", "cuda") instead of the
    devices' own (a program that cannot run here, `zaya_jax.bench.lowering`)."""
    devices = list(devices if devices is not None else jax.devices())
    need = math.prod(int(config.mesh[a]) for a in AXES)
    if need > len(devices):
        raise ValueError(
            f"mesh {dict(config.mesh)} needs {need} devices, {len(devices)} available "
            "(emulate more with --cpu_devices=N)"
        )
    mesh = make_mesh(config, devices[:need])
    training = prepare_abstract(config, mesh)
    with jax.set_mesh(mesh):
        traced = training.step.jitted.trace(training.state, abstract_batch(config, mesh))
        lowered = traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
    return lowered, mesh, training
