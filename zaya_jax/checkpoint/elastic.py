"""Elastic restarts on fewer devices (no jax import: `launch.train` calls this before jax loads).

The supervisor (or an operator) exports `ZAYA_AVAILABLE_DEVICES=N` when only N devices are healthy.
Before jax is imported, `apply_to_environment()` makes the process see N devices: on a CPU host the
emulated device count, on GPU hosts `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` (first N, unless
already set). After the config is loaded, `shrink_mesh(config, N)` rebuilds the mesh request with
`mesh.data = -1` (and expert/context axes reduced to divisors of N), so the trainer restores the last
checkpoint onto the smaller mesh. The global batch size is a config constant and does not change.
"""

from __future__ import annotations

import math
import os
import re

AVAILABLE_DEVICES_ENV = "ZAYA_AVAILABLE_DEVICES"
_COUNT_FLAG = "--xla_force_host_platform_device_count"


def available_devices() -> int | None:
    """$ZAYA_AVAILABLE_DEVICES as a positive int, or None when unset/empty."""
    raw = os.environ.get(AVAILABLE_DEVICES_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{AVAILABLE_DEVICES_ENV}={raw!r} must be a positive integer")
    return int(raw)


def apply_to_environment() -> int | None:
    """Restrict the devices this process will see to $ZAYA_AVAILABLE_DEVICES (call before importing jax)."""
    n = available_devices()
    if n is None:
        return None
    flags = re.sub(rf"{_COUNT_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_COUNT_FLAG}={n}".strip()  # CPU platform only; harmless elsewhere
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        os.environ.setdefault(var, ",".join(str(i) for i in range(n)))
    return n


def shrink_mesh(config, num_devices: int) -> dict[str, int]:
    """Fit `config.mesh` to `num_devices` (data = -1, expert/context reduced to divisors); returns the new sizes."""
    mesh = config.mesh
    context = math.gcd(max(int(mesh.context), 1), num_devices)
    expert = math.gcd(max(int(mesh.expert), 1), num_devices // context)
    expert = math.gcd(expert, int(config.model.num_experts))
    mesh.context, mesh.expert, mesh.data = context, expert, -1  # existing fields: allowed on a locked config
    return {"data": num_devices // (context * expert), "expert": expert, "context": context}
