"""Platform-specific implementations, in one place, chosen once from `model.kernels` (docs/kernels.md).

Model code calls the `Kernels` it was built with (`zaya_jax.model.zaya.Zaya` resolves them once and hands them to
every sub-module) — `kernels.einsum` / `kernels.linear` (mixed-precision GEMMs),
`kernels.grouped_swiglu` (dropless expert GEMMs), `kernels.causal_attention` — and reads as the paper's math;
which implementation runs is decided by `resolve(model_cfg)` for the target platform, not while tracing.

Modules: `choice` (the names, `resolve`), `matmul` (mixed-precision einsum), `xla_cpu` (XLA:CPU layouts and
bits), `grouped` / `grouped_loops` (expert GEMMs), `attention`. Lowering a step for ROCm / CUDA to check the
choice compiles there is `zaya_jax.bench.lowering`.
"""

from zaya_jax.kernels.choice import AUTO, Kernels, current_platform, describe, resolve, resolved_config
from zaya_jax.kernels.grouped import ExpertWeights
from zaya_jax.kernels.matmul import BATCHED_MATMUL, MATMUL

__all__ = [
    "AUTO",
    "BATCHED_MATMUL",
    "MATMUL",
    "ExpertWeights",
    "Kernels",
    "current_platform",
    "describe",
    "resolve",
    "resolved_config",
]
