"""The train step (1 device dropless, 2 data × 4 expert ZeRO-1 + EP, 2 data × 4 context) and cached generation
lower for ROCm and CUDA from this CPU host with no XLA:CPU construct left, the kernels `auto` resolves to for
each platform, and the layout's collectives (docs/kernels.md, "Lowering for GPUs without one")."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from zaya_jax.bench.lowering import CPU_ONLY, lower_step
from zaya_jax.config import load_config
from zaya_jax.kernels import choice as kernel_choice
from zaya_jax.kernels import matmul

PROGRAMS = {"1 device, dropless", "2 data x 4 expert, ZeRO-1 + EP", "2 data x 4 context", "cached generation"}


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_tiny_train_step_and_generation_lower_for_gpus(platform):
    report = lower_step(load_config("experiments/zaya1_tiny.py"), platform)
    assert report.problems == [] and report.cpu_only_ops == []
    assert set(report.programs) == PROGRAMS and all(n > 500 for n in report.programs.values())
    assert re.fullmatch(rf"lowered for {platform}: ok \(\d+ ops; CPU-only ops: 0\)", report.line())
    # CUDA: `tokamax` where the installed one compiles for GPUs (tests/kernels/test_choice.py); traced on this CPU
    # host it runs its XLA implementation, a `chlo.ragged_dot` as well
    cuda = "tokamax" if kernel_choice.tokamax_unusable() == "" else "ragged_dot"
    grouped = {"rocm": "ragged_dot_bf16", "cuda": cuda}[platform]
    kernels = f"kernels: platform={platform} matmul=xla grouped_gemm={grouped} attention=xla"
    assert any(note.startswith(kernels) for note in report.notes), report.notes


def test_bf16_step_for_rocm_keeps_no_cpu_layout_code():
    """In bf16 the XLA:CPU matmul would leave bits and layout constraints; resolved for ROCm it leaves none."""
    config = load_config("experiments/zaya1_tiny.py")
    config.model.dtype = "bfloat16"
    report = lower_step(config, "rocm")
    assert report.ok, (report.cpu_only_ops, report.problems)


@pytest.mark.parametrize("impl, hits", [("xla_cpu", True), ("xla", False)])
def test_cpu_only_constructs_are_detected(impl, hits):
    """The detector itself: a bf16 einsum's forward and backward lowered for ROCm with each matmul kernel."""
    a, b = jnp.ones((2, 8, 16), jnp.bfloat16), jnp.ones((16, 4), jnp.bfloat16)
    f = jax.jit(jax.grad(lambda a, b: jnp.sum(matmul.einsum("btk,kn->btn", a, b, jnp.bfloat16, impl))))
    text = f.trace(a, b).lower(lowering_platforms=("rocm",)).as_text()
    found = {name for name, pattern in CPU_ONLY.items() if any(pattern.search(line) for line in text.splitlines())}
    assert (found == set(CPU_ONLY)) if hits else not found
