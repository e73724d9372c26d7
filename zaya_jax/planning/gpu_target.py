"""GPU targets to compile for without the GPU (deviceless AOT, docs/planner.md "Compiling for a GPU without one").

A target is a device description XLA's GPU compiler reads instead of querying a device (a `GpuTargetConfigProto`
as text, kept in `zaya_jax/planning/gpu_targets/<name>.txtpb` with the facts it encodes and their source), the
platform's XLA flags (`gpu_targets/<platform>.xla_flags`, the one list: launch/<platform>/env.sh sets them for a real
run too), and the `zaya_jax.hardware.Hardware` of the device (HBM capacity, peaks). `topology_devices` makes the
compile-only devices of `nodes` × `gpus_per_node` such GPUs (`jax.experimental.topologies.get_topology_desc`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os

import ml_collections

from zaya_jax.config import ConfigError
from zaya_jax.hardware import get_hardware

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    name: str  # h100 | h200 | mi300x | mi325x
    platform: str  # cuda | rocm (jax's platform name, and launch/<platform>/env.sh)
    hardware: str  # key of zaya_jax.hardware.HARDWARE

    @property
    def config_file(self) -> str:
        return os.path.join(_HERE, "gpu_targets", f"{self.name}.txtpb")

    @property
    def hbm_bytes(self) -> float:
        return get_hardware(self.hardware).memory_bytes


TARGETS = {
    t.name: t
    for t in (
        GpuTarget("h100", "cuda", "h100"),
        GpuTarget("h200", "cuda", "h200"),
        GpuTarget("mi300x", "rocm", "mi300x"),
        GpuTarget("mi325x", "rocm", "mi325x"),
    )
}


def get_target(name: str) -> GpuTarget:
    """The named target; raises a one-line ConfigError for an unknown name."""
    key = str(name).strip().lower()
    if key not in TARGETS:
        raise ConfigError(f"unknown GPU target {name!r}; choose from {', '.join(TARGETS)}")
    return TARGETS[key]


def missing_extra(platform: str) -> str | None:
    """Why this environment cannot compile for `platform` (None: it can): the `gpu-compile` extra's packages."""
    package = {"cuda": "jax_plugins.xla_cuda12", "rocm": "jax_plugins.xla_rocm7"}[platform]
    try:
        found = importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return (
            f"compiling for {platform} needs the `gpu-compile` extra (jax 0.12, Python >= 3.12): "
            "pip install -e '.[gpu-compile]'"
        )
    return None


def _cudnn_version() -> tuple[int, int, int] | None:
    """The installed cuDNN's version (major, minor, patch), from its library."""
    import ctypes
    import glob

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "cudnn", "lib", "libcudnn.so*"))):
            try:
                version = int(ctypes.CDLL(path).cudnnGetVersion())
            except (OSError, AttributeError):
                continue
            return version // 10000, version // 100 % 100, version % 100
    return None


def target_config(target: GpuTarget) -> str:
    """The target's `GpuTargetConfigProto` text; for CUDA with `dnn_version_info` of the installed cuDNN."""
    with open(target.config_file, encoding="utf-8") as f:
        text = f.read()
    if target.platform == "cuda" and "dnn_version_info" not in text:
        version = _cudnn_version()
        if version is not None:
            text += "dnn_version_info {\n  major: %d\n  minor: %d\n  patch: %d\n}\n" % version
    return text


def flags_file(platform: str) -> str:
    """gpu_targets/<platform>.xla_flags: the platform's XLA flags, one per line with why (launch/<platform>/env.sh
    sets the same file's flags for a real run)."""
    return os.path.join(_HERE, "gpu_targets", f"{platform}.xla_flags")


@functools.cache
def xla_flags(platform: str) -> tuple[str, ...]:
    """The platform's XLA flags (`--name=value`, in order), as launch/<platform>/env.sh sets them."""
    path = flags_file(platform)
    if not os.path.exists(path):
        raise ConfigError(f"{path}: the {platform} XLA flags file is missing (reinstall zaya_jax)")
    with open(path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return tuple(line.split()[0] for line in lines if line.startswith("--"))


def compiler_options(platform: str, extra: tuple[str, ...] = ()) -> dict[str, bool | int | str]:
    """The platform's flags (then `extra`, e.g. `--xla_gpu_...=false`) as `compile(compiler_options=...)`, less
    those $XLA_FLAGS sets already (a process started with the platform's environment, as `launch.gpu_check`
    starts one per target)."""
    in_env = {f.split("=", 1)[0] for f in os.environ.get("XLA_FLAGS", "").split()}
    out = {}
    for flag in xla_flags(platform) + tuple(extra):
        name, _, value = flag.partition("=")
        if name not in in_env:
            out[name[2:]] = _typed(value)
    return out


def _typed(value: str) -> bool | int | str:
    """A flag's text as the typed value compile options take ('true' → True, '95' → 95)."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return int(value) if value.lstrip("-").isdigit() else value


def env_xla_flags(platform: str, extra: tuple[str, ...] = ()) -> str:
    """$XLA_FLAGS for a process that compiles for `platform` as a real run would (the platform's flags appended to
    any set already, as env.sh does)."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *xla_flags(platform), *extra]).strip()


def topology_devices(target: GpuTarget, nodes: int = 1, gpus_per_node: int = 8) -> list:
    """Compile-only devices of `nodes` × `gpus_per_node` GPUs of `target` (on any host; ROCm on a host without an
    AMD GPU loads `rocm_standins`). Only in a process whose jax platforms are cpu alone (JAX_PLATFORMS=cpu, as
    `launch.gpu_compile_job` starts one): elsewhere `jax.devices()` would start a real GPU backend first. Raises a
    one-line ConfigError when the platforms are not cpu-only, the `gpu-compile` extra is missing or the plugin
    cannot describe the topology."""
    import jax
    from jax.experimental import topologies

    platforms = [p.strip() for p in (jax.config.jax_platforms or "").split(",") if p.strip()]
    if platforms != ["cpu"]:
        raise ConfigError(
            f"compiling for {target.name} needs a process with JAX_PLATFORMS=cpu (here: "
            f"{','.join(platforms) or 'unset'}); use launch.gpu_check --compile or launch.gpu_compile_job"
        )
    reason = missing_extra(target.platform)
    if reason:
        raise ConfigError(reason)
    if nodes < 1 or gpus_per_node < 1:
        raise ConfigError(f"topology {nodes} x {gpus_per_node}: nodes and GPUs per node must be >= 1")
    jax.devices()  # this process's own backend first: a plugin registered below is never its default
    if target.platform == "rocm":
        from zaya_jax.planning import rocm_standins

        try:
            rocm_standins.register_compile_only_plugin()
        except rocm_standins.StandinError as err:
            raise ConfigError(f"compiling for {target.name}: {err}") from err
    try:
        topo = topologies.get_topology_desc(
            platform=target.platform, target_config=target_config(target), topology=f"1x{nodes}x{gpus_per_node}"
        )
    except Exception as err:  # noqa: BLE001 - jaxlib raises JaxRuntimeError / RuntimeError; one line for the caller
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"describing {nodes} x {gpus_per_node} {target.name} GPUs: {type(err).__name__}: {first}"
        ) from err
    devices = list(topo.devices)
    if target.platform == "rocm":
        _describe_for_pallas(target, devices[0].device_kind)
    return devices


def _gcn_arch(target: GpuTarget) -> str:
    """The target's GPU architecture (`gcn_arch_name` in its config, less feature flags: "gfx942")."""
    for line in target_config(target).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "gcn_arch_name":
            return value.strip().strip('"').split(":")[0]
    raise ConfigError(f"{target.config_file}: no gcn_arch_name")


def _describe_for_pallas(target: GpuTarget, device_kind: str) -> None:
    """Tell Pallas's Triton lowering (the `pallas` attention kernel) which GPU a compile-only ROCm device is. It
    asks the default device for its architecture; a compile-only device's kind ("AMD Instinct MI300X") names
    none, so register the kind with the target's architecture (jax's registry of device kinds it cannot map)."""
    from jax._src.pallas.triton import gpu_info

    arch = _gcn_arch(target)
    gpu_info.registry[device_kind] = lambda: gpu_info.GpuInfo(gpu_version=None, arch_name=arch, compute_capability=0)


def topology_for(mesh: dict[str, int], nodes: int | None = None, gpus_per_node: int = 8) -> tuple[int, int]:
    """(nodes, GPUs per node) for a mesh of axis sizes (one may be -1). With `nodes` the topology is nodes ×
    gpus_per_node and a -1 axis fills it; without, it is the mesh's size (a -1 axis counts 1) on one node when
    it fits in `gpus_per_node` GPUs, else on size / gpus_per_node full nodes."""
    if nodes is not None:
        return nodes, gpus_per_node
    size = 1
    for value in mesh.values():
        size *= max(int(value), 1)
    if size <= gpus_per_node:
        return 1, size
    if size % gpus_per_node:
        raise ConfigError(
            f"mesh {mesh} has {size} devices, not a multiple of {gpus_per_node} GPUs per node; "
            "give --nodes (and --gpus_per_node) or a mesh that fills whole nodes"
        )
    return size // gpus_per_node, gpus_per_node


def batch_per_shard(config, mesh: dict[str, int], num_devices: int) -> int:
    """Sequences per batch shard (data × expert) per micro-batch that keep `config`'s global batch on `mesh`
    over `num_devices` (at least 1: a batch smaller than the mesh gets one sequence per shard)."""
    from zaya_jax.parallel.mesh import AXES, BATCH_AXES, resolve_mesh_shape

    sizes = resolve_mesh_shape(ml_collections.ConfigDict({a: int(mesh.get(a, 1)) for a in AXES}), num_devices)
    shards = sizes[BATCH_AXES[0]] * sizes[BATCH_AXES[1]] * int(config.train.microbatches)
    return max(int(config.train.global_batch_size) // shards, 1)
