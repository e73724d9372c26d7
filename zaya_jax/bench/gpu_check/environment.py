"""Section 1: what ran — device, driver / runtime, jax / jaxlib / plugin versions, XLA_FLAGS and the environment
variables that change how XLA, the collectives and the kernels behave, and the kernels the config resolves to."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess

import jax
import ml_collections

from zaya_jax.bench.gpu_check.report import Section

# distributions whose versions matter on an accelerator (present ones are reported)
PACKAGES = (
    "jax",
    "jaxlib",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-rocm7-plugin",
    "jax-rocm7-pjrt",
    "flax",
    "optax",
    "tokamax",
    "transformer-engine-jax",
)
# environment variables read by XLA, the runtimes, the collective libraries and the fused-kernel libraries
ENV_PREFIXES = ("XLA_", "JAX_", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCM_", "CUDA_", "NVTE_", "TF_", "GPU_MAX_HW_QUEUES")
# commands that print the driver version (the first one found is run, with a short timeout)
DRIVER_QUERIES = (
    ("nvidia-smi", ("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")),
    ("rocm-smi", ("--showdriverversion", "--showproductname")),
)


def versions() -> dict[str, str]:
    """Installed versions of `PACKAGES` (absent ones left out)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def relevant_env() -> dict[str, str]:
    """Environment variables starting with one of `ENV_PREFIXES`, sorted."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def driver() -> str:
    """One line from the vendor tool (nvidia-smi / rocm-smi), or why there is none."""
    for tool, args in DRIVER_QUERIES:
        path = shutil.which(tool)
        if path is None:
            continue
        try:
            out = subprocess.run([path, *args], capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.SubprocessError) as err:
            return f"{tool} failed: {err}"
        lines = [x.strip() for x in out.splitlines() if x.strip() and not x.startswith("=")]
        return f"{tool}: " + "; ".join(lines[:4])
    return "no nvidia-smi / rocm-smi on PATH"


def runtime_version() -> str:
    """The PJRT client's platform version (CUDA / ROCm runtime of the plugin; '<unknown>' on CPU)."""
    try:
        return str(jax.devices()[0].client.platform_version)
    except Exception as err:  # noqa: BLE001 — informational only
        return f"<unknown: {type(err).__name__}>"


def run(section: Section, model_cfg: ml_collections.ConfigDict) -> None:
    """Rows: device kind / count / platform, runtime and driver, versions, environment, resolved kernels."""
    from zaya_jax import kernels

    dev = jax.devices()[0]
    add = section.add
    add("device", "device_kind", dev.device_kind)
    add("device", "platform", dev.platform)
    add("device", "backend", jax.default_backend())
    add("device", "device_count", jax.device_count())
    stats = dev.memory_stats() or {}
    if "bytes_limit" in stats:
        add("device", "memory_limit", round(stats["bytes_limit"] / 2**30, 2), "GiB")
    add("runtime", "platform_version", runtime_version())
    add("runtime", "driver", driver())
    for name, version in versions().items():
        add("versions", name, version)
    env = relevant_env()
    add("environment", "XLA_FLAGS", env.pop("XLA_FLAGS", ""))
    for name, value in env.items():
        add("environment", name, value)
    note = "model.kernels=auto on this host (zaya_jax.kernels.resolve)"
    add("kernels", "resolved", kernels.describe(model_cfg), note=note)
