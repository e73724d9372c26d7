"""The device mesh: axes `data`, `context`, `expert` (innermost, so experts exchange tokens over the
fastest links — the 8 GPUs of an MI300X node), built from `config.mesh` (`-1` fills the rest).

Multi-process aware: the mesh spans `jax.devices()` (all processes' devices); axis types are passed
explicitly (`Auto`: GSPMD-style propagation; `jax.shard_map` makes axes manual where needed).

Whether a config's batch schedule fits a mesh is checked by `zaya_jax.train.schedule.check_layout`.
"""

from __future__ import annotations

import math

import jax
import ml_collections
from jax.sharding import AxisType, Mesh

from zaya_jax.config import ConfigError

AXES = ("data", "context", "expert")
# Mesh axes that split the batch of tokens outside attention (the expert axis doubles as data parallelism
# for the dense parts of the model, DeepSpeed-MoE style).
BATCH_AXES = ("data", "expert")


def resolve_mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """Sizes for `AXES`, with one `-1` replaced by what fills `num_devices`. Raises ConfigError if it doesn't fit."""
    sizes = {name: int(mesh_cfg[name]) for name in AXES}
    fill = [name for name, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {sizes}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if num_devices % fixed:
            raise ConfigError(f"mesh {sizes} does not fit {num_devices} devices: {num_devices} is not divisible by "
                              f"the fixed axes' product {fixed}; change mesh.* so the sizes multiply to {num_devices}")
        sizes[fill[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ConfigError(f"mesh {sizes} does not fit {num_devices} devices: it uses {math.prod(sizes.values())}; "
                          "set one axis to -1 or make the sizes multiply to the device count")
    return sizes


def make_mesh(config: ml_collections.ConfigDict, devices: list | None = None) -> Mesh:
    """Build the mesh for `config.mesh` over `devices` (default: all devices of all processes)."""
    devices = list(jax.devices()) if devices is None else list(devices)
    sizes = resolve_mesh_shape(config.mesh, len(devices))
    num_experts = config.model.num_experts
    if num_experts % sizes["expert"]:
        raise ConfigError(f"model.num_experts={num_experts} is not divisible by mesh.expert={sizes['expert']}; "
                          "choose an expert axis size that divides the expert count")
    shape = tuple(sizes[name] for name in AXES)
    axis_types = (AxisType.Auto,) * len(AXES)
    if len(devices) == len(jax.devices()):
        return jax.make_mesh(shape, AXES, axis_types=axis_types)
    import numpy as np

    return Mesh(np.asarray(devices).reshape(shape), AXES, axis_types=axis_types)


def axis_size(mesh: Mesh, *names: str) -> int:
    return math.prod(mesh.shape[name] for name in names)


def active_mesh():
    """The active abstract mesh (`jax.set_mesh` / inside `jax.shard_map`) if it has this project's axes, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or not set(AXES) <= set(mesh.axis_names) else mesh


def in_manual_region() -> bool:
    """True inside a `jax.shard_map` over every mesh axis (e.g. the ZeRO-1 train step): the code sees this
    device's local arrays and communicates with explicit collectives (psum, all_to_all, ppermute, ...)."""
    mesh = active_mesh()
    return mesh is not None and set(AXES) <= set(getattr(mesh, "manual_axes", ()))
