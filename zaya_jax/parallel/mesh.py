"""The device mesh: axes `data`, `context`, `expert` (innermost, so experts exchange tokens over the
fastest links — the 8 GPUs of an MI300X node), built from `config.mesh` (`-1` fills the rest).

Multi-process aware: the mesh spans `jax.devices()` (all processes' devices); axis types are passed
explicitly (`Auto`: GSPMD-style propagation; `jax.shard_map` makes axes manual where needed).

Several nodes (one process per node, as `launch/rocm` starts them): the mesh is built as a hybrid of the
slow inter-node network (DCN: the NICs) and the fast in-node links (ICI / xGMI), as MaxText's `dcn_*` /
`ici_*` parallelism does with `jax.experimental.mesh_utils.create_hybrid_device_mesh`: only `data` spans
nodes (DCN shape data=nodes), while `context` and `expert` — the axes with all-to-all and ring traffic every
layer — stay inside a node (ICI shape data/nodes × context × expert), whatever order the runtime lists the
devices in (arXiv 2511.17127 §2 trains with data parallelism across nodes).

Whether a config's batch schedule fits a mesh is checked by `zaya_jax.train.schedule.check_layout`.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from zaya_jax.config import ConfigError

AXES = ("data", "context", "expert")
# Mesh axes that split the batch of tokens outside attention (the expert axis doubles as data parallelism
# for the dense parts of the model, DeepSpeed-MoE style).
BATCH_AXES = ("data", "expert")


def parse_mesh_spec(text: str) -> dict[str, int]:
    """The launchers' one mesh syntax: 'data:4,expert:2' → {'data': 4, 'context': 1, 'expert': 2} (axes not named
    are 1; one size may be -1 to fill the devices). Raises a one-line ConfigError."""
    sizes = dict.fromkeys(AXES, 1)
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, sep, value = part.partition(":")
        if not sep or name.strip() not in AXES or not value.strip().lstrip("-").isdigit():
            raise ConfigError(
                f"mesh {text!r}: {part!r} is not axis:size; use comma-separated axis:size with axes "
                f"{', '.join(AXES)}, e.g. data:4,expert:2"
            )
        sizes[name.strip()] = int(value)
    return sizes


def resolve_mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> dict[str, int]:
    """Sizes for `AXES`, with one `-1` replaced by what fills `num_devices`. Raises ConfigError if it doesn't fit."""
    sizes = {name: int(mesh_cfg[name]) for name in AXES}
    fill = [name for name, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {sizes}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if num_devices % fixed:
            raise ConfigError(
                f"mesh {sizes} does not fit {num_devices} devices: {num_devices} is not divisible by "
                f"the fixed axes' product {fixed}; change mesh.* so the sizes multiply to {num_devices}"
            )
        sizes[fill[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ConfigError(
            f"mesh {sizes} does not fit {num_devices} devices: it uses {math.prod(sizes.values())}; "
            "set one axis to -1 or make the sizes multiply to the device count"
        )
    return sizes


def make_mesh(config: ml_collections.ConfigDict, devices: list | None = None) -> Mesh:
    """Build the mesh for `config.mesh` over `devices` (default: all devices of all processes)."""
    devices = list(jax.devices()) if devices is None else list(devices)
    sizes = resolve_mesh_shape(config.mesh, len(devices))
    num_experts = config.model.num_experts
    if num_experts % sizes["expert"]:
        raise ConfigError(
            f"model.num_experts={num_experts} is not divisible by mesh.expert={sizes['expert']}; "
            "choose an expert axis size that divides the expert count"
        )
    shape = tuple(sizes[name] for name in AXES)
    axis_types = (AxisType.Auto,) * len(AXES)
    if len({d.process_index for d in devices}) > 1:
        return Mesh(hybrid_device_grid(sizes, devices), AXES, axis_types=axis_types)
    if devices == list(jax.devices()):  # all of this process's devices: jax orders them by the physical topology
        return jax.make_mesh(shape, AXES, axis_types=axis_types)
    # any other list (a subset, or another backend's devices, e.g. a GPU topology compiled for from a CPU host)
    # is laid out in the order given
    return Mesh(np.asarray(devices).reshape(shape), AXES, axis_types=axis_types)


def hybrid_device_grid(sizes: dict[str, int], devices: list):
    """Devices [data, context, expert] for several nodes (one process each): DCN shape (nodes, 1, 1), ICI shape
    (data / nodes, context, expert); node k holds data rows [k·data/nodes, (k+1)·data/nodes). Raises a one-line
    ConfigError if `context` × `expert` does not fit in a node or `data` does not split over the nodes."""
    nodes = len({d.process_index for d in devices})
    per_node = len(devices) // nodes
    inner = sizes["context"] * sizes["expert"]
    if sizes["data"] % nodes or inner * (sizes["data"] // nodes) != per_node:
        raise ConfigError(
            f"mesh {sizes} over {nodes} nodes of {per_node} devices: only mesh.data spans nodes "
            f"(context and expert stay inside a node), so mesh.data must be a multiple of {nodes} and "
            f"context x expert ({inner}) must divide the {per_node} devices of a node"
        )
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return mesh_utils.create_hybrid_device_mesh(
        (sizes["data"] // nodes, sizes["context"], sizes["expert"]), (nodes, 1, 1), ordered, process_is_granule=True
    )


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
