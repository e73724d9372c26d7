"""Elastic restarts on fewer devices (no jax import: `launch.train` calls this before jax loads).

The supervisor (or an operator) exports `ZAYA_AVAILABLE_DEVICES=N` when only N devices are healthy.
Before jax starts its backend, `apply_to_environment()` makes the process see N devices: on a CPU host the
emulated device count (`jax_num_cpu_devices`), on GPU hosts `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES`
(the first N entries of the list, or 0..N-1 if unset). After the config is loaded, `shrink_mesh(config, N)`
picks the largest mesh of at most N
devices that the config can run on (the global batch must still split evenly) and rebuilds the mesh request
with `mesh.data = -1`; if that mesh uses fewer than N devices, `use_devices(k)` hides the rest. The trainer
then restores the last checkpoint onto the smaller mesh. The global batch size is a config constant and
does not change.
"""

from __future__ import annotations

import os
import sys

from zaya_jax.config.errors import ConfigError

AVAILABLE_DEVICES_ENV = "ZAYA_AVAILABLE_DEVICES"
NUM_CPU_DEVICES_ENV = "JAX_NUM_CPU_DEVICES"  # jax's `jax_num_cpu_devices` option, read when jax is imported


def available_devices() -> int | None:
    """$ZAYA_AVAILABLE_DEVICES as a positive int, or None when unset/empty."""
    raw = os.environ.get(AVAILABLE_DEVICES_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{AVAILABLE_DEVICES_ENV}={raw!r} must be a positive integer")
    return int(raw)


def use_devices(count: int) -> None:
    """Make this process see only its first `count` devices: the emulated CPU device count, and the first
    `count` entries of CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES (all of 0..count-1 if unset). Takes effect
    only before jax initialises its backends (the CPU count wins over XLA_FLAGS' device count)."""
    os.environ[NUM_CPU_DEVICES_ENV] = str(count)  # CPU platform only; harmless elsewhere
    if "jax" in sys.modules:  # imported already (absl flags): set the option itself, its env var is read at import
        try:
            sys.modules["jax"].config.update("jax_num_cpu_devices", int(count))
        except RuntimeError:  # the backend already runs (a test process): only a new process sees the count
            pass
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        ids = os.environ.get(var) or ",".join(str(i) for i in range(count))
        os.environ[var] = ",".join(ids.split(",")[:count])


def apply_to_environment() -> int | None:
    """Restrict the devices this process will see to $ZAYA_AVAILABLE_DEVICES (call before jax's backend starts)."""
    n = available_devices()
    if n is not None:
        use_devices(n)
    return n


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def shrink_mesh(config, num_devices: int) -> dict[str, int]:
    """Fit `config.mesh` to at most `num_devices` devices; returns the new sizes {'data', 'expert', 'context'}.

    Picks the most devices k <= num_devices on which the config can run (`zaya_jax.train.schedule.check_layout`:
    e.g. a global batch of 8 does not split over 3 data shards, so 3 available devices give a 2-device mesh),
    keeping as much of the configured context, then expert, parallelism as divides k. Sets mesh.context /
    mesh.expert and mesh.data = -1 (existing fields: allowed on a locked config). When k < num_devices, call
    `use_devices(k)` before jax starts. Raises ConfigError (one line) if no mesh fits.
    """
    from zaya_jax.train.schedule import check_layout  # imports jax: the supervisor imports this module jax-free

    mesh, experts = config.mesh, int(config.model.num_experts)
    first_error = None
    for k in range(num_devices, 0, -1):
        for context in (c for c in _divisors(max(int(mesh.context), 1)) if k % c == 0):
            for expert in (
                e for e in _divisors(max(int(mesh.expert), 1)) if (k // context) % e == 0 and experts % e == 0
            ):
                sizes = {"data": k // (context * expert), "expert": expert, "context": context}
                try:
                    check_layout(config, sizes)
                except ConfigError as err:
                    first_error = first_error or err
                    continue
                mesh.context, mesh.expert, mesh.data = context, expert, -1
                return sizes
    raise ConfigError(
        f"elastic restart on {num_devices} devices: no mesh of at most {num_devices} devices fits the "
        f"config ({first_error})"
    )
