"""What the throughput and memory sections measure: the configs (a variant of experiments/zaya1.py with
overrides, on one device) and, per platform, the kernel cases — each grouped-GEMM implementation and each
attention kernel (`zaya_jax.kernels`, `model.kernels.*`).

Configs that fill one GPU (80–192 GB): `h1024` (123M total / 34M active) at 8 × 4096 tokens and `1b` (the
ZAYA1-base layer, 5 layers: 1.1B total / 161M active) at 4 × 4096 tokens, both bf16 without remat. `--smoke`
uses the `tiny` variant at its CPU size.

Grouped-GEMM lowering flags (XLA reads XLA_FLAGS once per process, so a case that needs a different setting
runs in a subprocess): XLA's default GPU lowering of `ragged_dot` pads it to a dense batched dot (openxla/xla PR
#45996); ROCm has a hipBLASLt grouped GEMM behind `--xla_gpu_experimental_use_ragged_dot_grouped_gemm` (ROCm/xla
PR #514); on CUDA this jaxlib's alternative is `--xla_gpu_experimental_use_ragged_dot_fusion` (a Triton flag named in
newer XLA sources is unknown to jaxlib 0.10-0.12, and XLA aborts on an unknown flag;
tests/integration/test_rocm_launch.py checks these names).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from zaya_jax.config import load_config

ZAYA1 = "experiments/zaya1.py"
GROUPED_LOWERING_FLAG = {
    "rocm": "--xla_gpu_experimental_use_ragged_dot_grouped_gemm",
    "cuda": "--xla_gpu_experimental_use_ragged_dot_fusion",
}
ATTENTION_KERNELS = {"cpu": ("xla",), "rocm": ("xla", "pallas"), "cuda": ("xla", "cudnn", "pallas")}


@dataclasses.dataclass(frozen=True)
class ConfigRef:
    """A variant of experiments/zaya1.py (`arg`) with `section.field` overrides, named `name` in the report.
    JSON-able, so a subprocess can load the same config."""

    name: str
    arg: str
    overrides: tuple[tuple[str, Any], ...] = ()

    def load(self, extra: tuple[tuple[str, Any], ...] = ()) -> ml_collections.ConfigDict:
        from zaya_jax.bench.gpu_check.steps import one_device

        return one_device(load_config(ZAYA1, self.arg), **dict(self.overrides + tuple(extra)))

    @classmethod
    def from_json(cls, d: dict) -> ConfigRef:
        return cls(d["name"], d["arg"], tuple((k, v) for k, v in d["overrides"]))


BF16 = (("model.dtype", "bfloat16"), ("model.remat", "none"))
FILL_CONFIGS = {
    "h1024": ConfigRef("h1024", "h1024", BF16 + (("train.seq_len", 4096), ("train.global_batch_size", 8))),
    "1b": ConfigRef("1b", "1b", BF16),
}
SMOKE_CONFIG = ConfigRef("tiny", "tiny", BF16)


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel choice: `overrides` of model.dispatch / model.kernels.*; `lowering` = the grouped-GEMM lowering
    flag's wanted state (True on, False off, None as the environment has it)."""

    label: str
    overrides: tuple[tuple[str, Any], ...]
    lowering: bool | None = None
    grouped: bool = True  # a grouped-GEMM case (also timed as a MoE block against the dense block)

    @classmethod
    def from_json(cls, d: dict) -> Case:
        return cls(d["label"], tuple((k, v) for k, v in d["overrides"]), d["lowering"], d["grouped"])


def dropless(kernel: str) -> tuple[tuple[str, Any], ...]:
    return (("model.dispatch", "dropless"), ("model.kernels.grouped_gemm", kernel))


def kernel_cases(platform: str, *, tokamax: bool) -> list[Case]:
    """Grouped-GEMM cases then attention cases for `platform` ("cpu" | "cuda" | "rocm")."""
    if platform == "cpu":
        cases = [Case("loops", dropless("loops")), Case("ragged_dot", dropless("ragged_dot"))]
    else:
        cases = [
            Case("ragged_dot (XLA default lowering)", dropless("ragged_dot"), lowering=False),
            Case("ragged_dot (grouped lowering flag)", dropless("ragged_dot"), lowering=True),
            # bf16 results (auto on ROCm): what the ROCm flag lowers to a grouped GEMM; the flag as XLA_FLAGS has it
            Case("ragged_dot_bf16", dropless("ragged_dot_bf16")),
        ]
        if tokamax:
            cases.append(Case("tokamax", dropless("tokamax")))
    cases.append(Case("capacity", (("model.dispatch", "capacity"),)))
    for kernel in ATTENTION_KERNELS[platform]:
        cases.append(Case(f"attention {kernel}", (("model.kernels.attention", kernel),), grouped=False))
    return cases


def flag_state(flag: str, xla_flags: str | None = None) -> bool:
    """Whether `flag` is switched on in XLA_FLAGS (`flag`, `flag=true` or `flag=1`)."""
    text = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    values = [item.partition("=")[2].lower() for item in text.split() if item.partition("=")[0] == flag]
    return bool(values) and values[-1] in ("", "true", "1")


def with_flag(flag: str, on: bool, xla_flags: str | None = None) -> str:
    """XLA_FLAGS with `flag` set to `on` (any earlier setting of it removed)."""
    text = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    kept = [item for item in text.split() if item.partition("=")[0] != flag]
    return " ".join([*kept, f"{flag}={'true' if on else 'false'}"])


def needs_subprocess(case: Case, platform: str) -> bool:
    """The case wants the grouped-lowering flag in a state this process's XLA_FLAGS do not have."""
    flag = GROUPED_LOWERING_FLAG.get(platform)
    return flag is not None and case.lowering is not None and case.lowering != flag_state(flag)


def tokamax_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("tokamax") is not None
