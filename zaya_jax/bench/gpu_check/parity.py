"""Section 3: loss parity — 10 train steps of the tiny config on this host's accelerator against the same 10
steps in fp32 on the CPU.

Both sides build the default train step (ZeRO-1, Muon + AdamW; `steps.build`) from the same seed, on one device,
and train on the same batch every step (`steps.token_batch`) with a one-step warm-up of the learning rate, so the
loss falls from the first step and any difference in the updates shows in the loss. The CPU side runs in a
process of its own with JAX_PLATFORMS=cpu (on a CPU-only host: in this process, which already is one).

The accelerator runs the steps twice: fp32 with `highest` matmul precision (no TF32: the same arithmetic as the
reference up to reduction order) and bf16 (the training dtype). The check is the largest absolute difference of
the per-step losses (nats), against `TOLERANCE[dtype]`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import jax
import ml_collections

from zaya_jax.bench.gpu_check import cases, steps
from zaya_jax.bench.gpu_check.report import FAIL, PASS, Section, sig
from zaya_jax.config import load_config

STEPS = 10
# max |loss - CPU fp32 loss| over the 10 steps, nats (the losses are ≈ 6). fp32: reduction order only (a few
# 1e-6 per step on CPU between device layouts). bf16: 8 mantissa bits in every GEMM operand; on the CPU the
# bf16 run differs from the fp32 one by at most 0.02 over these steps, the bound leaves 2.5x for the accelerator's
# different accumulation order.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05}


def parity_config(dtype: str) -> ml_collections.ConfigDict:
    """The tiny variant on one device, compute dtype `dtype` (fp32 master weights), LR warm-up of one step."""
    tiny = load_config(cases.ZAYA1, "tiny")
    return steps.one_device(tiny, **{"model.dtype": dtype, "optimizer.warmup_steps": 1})


def losses(dtype: str, steps_n: int = STEPS, fast_compile: bool = False) -> list[float]:
    """The per-step losses of `steps_n` steps on this process's default device (fp32: `highest` precision)."""
    precision = jax.default_matmul_precision("highest") if dtype == "float32" else contextlib.nullcontext()
    with precision:
        run = steps.build(parity_config(dtype), fast_compile)
        try:
            return run.losses(steps_n)
        finally:
            steps.release_all([run])


def reference_losses(steps_n: int = STEPS, fast_compile: bool = False) -> list[float]:
    """The CPU fp32 reference (call it in a CPU-only process)."""
    if jax.default_backend() != "cpu":
        raise RuntimeError("the parity reference must run with JAX_PLATFORMS=cpu")
    return losses("float32", steps_n, fast_compile)


def run(section: Section, reference: Callable[[], list[float]], fast_compile: bool = False) -> None:
    """Rows per accelerator dtype: first / last loss of both sides and the largest difference (the check)."""
    on_cpu = jax.default_backend() == "cpu"
    dtypes = ["bfloat16"] if on_cpu else ["float32", "bfloat16"]  # fp32 on the CPU *is* the reference
    ref = reference()
    section.add("cpu float32 (reference)", "loss_first", sig(ref[0], 7))
    section.add("cpu float32 (reference)", "loss_last", sig(ref[-1], 7))
    section.notes.append("reference losses: " + ", ".join(f"{x:.5f}" for x in ref))
    for dtype in dtypes:
        got = losses(dtype, len(ref), fast_compile)
        case = f"{jax.default_backend()} {dtype}"
        diff = max(abs(a - b) for a, b in zip(got, ref))
        ok = math.isfinite(diff) and diff <= TOLERANCE[dtype]
        section.add(case, "loss_first", sig(got[0], 7))
        section.add(case, "loss_last", sig(got[-1], 7))
        section.add(
            case,
            "max_abs_diff",
            sig(diff, 3),
            "nats",
            PASS if ok else FAIL,
            f"tolerance {TOLERANCE[dtype]} over {len(ref)} steps",
        )
        section.notes.append(f"{case} losses: " + ", ".join(f"{x:.5f}" for x in got))
    falls = ref[-1] < ref[0]
    section.add(
        "cpu float32 (reference)",
        "loss_falls",
        falls,
        check=PASS if falls else FAIL,
        note="the same batch every step: the loss must fall",
    )
