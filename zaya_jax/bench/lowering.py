"""Lower the train step and cached generation for a GPU platform from any host (docs/kernels.md, "Lowering").

`jax.jit(f).trace(...).lower(lowering_platforms=("rocm",))` checks, without the device, that every primitive has
a lowering for the platform; it neither compiles nor autotunes. `lower_step(config, platform)` lowers four
programs of `config`'s model with its kernels resolved for `platform` — the train step on one device (dropless
experts), on 2 data × 4 expert (ZeRO-1, expert parallel), on 2 data × 4 context (context parallel), and cached
generation — and checks each module:

* no XLA:CPU-only construct (a bf16 ↔ uint16 bitcast, a `LayoutConstraint` custom call);
* the kernels it resolved to are there: `chlo.ragged_dot` for the `ragged_dot` grouped GEMM, cuDNN's fused
  attention custom call for `cudnn`;
* the collectives of its layout: reduce-scatter and all-gather for ZeRO-1, all-to-all for expert parallelism.

cuDNN and Pallas attention query the local GPU while they are lowered, so a host without the target's GPU lowers
`attention=xla` in their place and says so in the notes; `launch.gpu_check` runs them on a GPU (and
`--compile` builds them for one).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax import kernels as kernel_choice
from zaya_jax.inference.cache import dropless
from zaya_jax.inference.generate import trace_generate
from zaya_jax.model import abstract_model
from zaya_jax.planning.abstract_step import lower_train_step

CPU_ONLY = {  # what XLA:CPU specialisations leave in a module, by a regex on its StableHLO text
    "bf16↔uint16 bitcast": re.compile(r"stablehlo\.bitcast_convert .*(bf16.*ui16|ui16.*bf16)"),
    "LayoutConstraint custom call": re.compile(r"custom_call @LayoutConstraint"),
}
OP = re.compile(r"^\s*(%[\w#:]+(, %[\w#:]+)* = )?\"?(stablehlo|chlo|sdy|mhlo)\.\w+")
# (name, mesh sizes, what the step must contain): the multi-device programs need 8 devices
STEPS = (
    ("1 device, dropless", dict(data=1, expert=1, context=1)),
    ("2 data x 4 expert, ZeRO-1 + EP", dict(data=2, expert=4, context=1)),
    ("2 data x 4 context", dict(data=2, expert=1, context=4)),
)


@dataclasses.dataclass
class LoweringReport:
    """What lowering `config`'s programs for `platform` found (summed over the programs)."""

    platform: str
    num_ops: int = 0
    cpu_only_ops: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)  # failed lowerings and missing kernels
    notes: list[str] = dataclasses.field(default_factory=list)
    programs: dict[str, int] = dataclasses.field(default_factory=dict)  # program → its op count

    @property
    def ok(self) -> bool:
        return not self.cpu_only_ops and not self.problems

    def line(self) -> str:
        status = "ok" if self.ok else "FAILED"
        return f"lowered for {self.platform}: {status} ({self.num_ops} ops; CPU-only ops: {len(self.cpu_only_ops)})"


def for_platform(config: ml_collections.ConfigDict, platform: str) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A copy of `config` whose kernels resolve for `platform`, and notes on what had to change to lower it here."""
    cfg = ml_collections.ConfigDict(config.to_dict())
    cfg.model.kernels.platform = platform
    notes = []
    attention = kernel_choice.resolve(cfg.model).attention
    if attention in ("cudnn", "pallas") and kernel_choice.current_platform() != platform:
        cfg.model.kernels.attention = "xla"
        notes.append(f"attention={attention} queries the local GPU when lowered: lowered with attention=xla here")
    return cfg, notes


def lower_step(config: ml_collections.ConfigDict, platform: str, devices: list | None = None) -> LoweringReport:
    """Lower `config`'s train steps (`STEPS`) and cached generation for `platform` ("rocm" | "cuda") and check them."""
    cfg, notes = for_platform(config, platform)
    report = LoweringReport(platform, notes=notes)
    chosen = kernel_choice.resolve(cfg.model)
    report.notes.append(f"kernels: {kernel_choice.describe(cfg.model)}")
    devices = list(devices if devices is not None else jax.devices())
    for name, mesh in STEPS:
        need = mesh["data"] * mesh["expert"] * mesh["context"]
        if need > len(devices):
            report.problems.append(f"{name}: needs {need} devices, {len(devices)} here (run with --cpu_devices=8)")
            continue
        _check(report, name, lambda: _lower_train_step(_step_config(cfg, mesh), platform, devices), chosen, mesh)
    _check(report, "cached generation", lambda: _lower_generate(cfg, platform), chosen, None)
    return report


def _check(report: LoweringReport, name: str, lower, chosen, mesh: dict | None) -> None:
    try:
        text = lower()
    except Exception as e:  # a primitive without a lowering for the platform, or a kernel that cannot lower here
        report.problems.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return
    ops = sum(1 for line in text.splitlines() if OP.match(line))
    report.num_ops += ops
    report.programs[name] = ops
    for what, pattern in CPU_ONLY.items():
        hits = sum(1 for line in text.splitlines() if pattern.search(line))
        if hits:
            report.cpu_only_ops.append(f"{name}: {hits} x {what}")
    for needed in _expected(chosen, mesh):
        if needed not in text:
            report.problems.append(f"{name}: no {needed} in the lowered module")


def _expected(chosen, mesh: dict | None) -> list[str]:
    """Substrings the lowered module must contain for the kernels `chosen` and the step's mesh."""
    expert_parallel = mesh is not None and mesh["expert"] > 1
    needed = []
    if not expert_parallel and chosen.grouped_gemm in ("ragged_dot", "ragged_dot_bf16"):
        needed.append("chlo.ragged_dot")
    if mesh is not None and chosen.attention == "cudnn":
        needed.append("cudnn")
    if mesh is not None and mesh["data"] * mesh["expert"] * mesh["context"] > 1:
        needed += ["stablehlo.reduce_scatter", "stablehlo.all_gather"]
    if expert_parallel:
        needed.append("stablehlo.all_to_all")
    return needed


def _step_config(cfg: ml_collections.ConfigDict, mesh: dict[str, int]) -> ml_collections.ConfigDict:
    """`cfg` on `mesh`, ZeRO-1, `auto` dispatch, a small batch of 128-token sequences."""
    step = ml_collections.ConfigDict(cfg.to_dict())
    step.mesh.update(mesh)
    step.model.dispatch = "auto"
    step.train.param_sharding = "zero1"
    step.train.seq_len = 128
    step.train.microbatches = 1
    step.train.batch_ramp = ()
    step.train.global_batch_size = 2 * mesh["data"] * mesh["expert"]
    return step


def _lower_train_step(config: ml_collections.ConfigDict, platform: str, devices: list) -> str:
    return lower_train_step(config, devices, platform=platform)[0].as_text()


def _lower_generate(config: ml_collections.ConfigDict, platform: str) -> str:
    graphdef, state = nnx.split(dropless(abstract_model(config.model)))  # as `generate` runs it
    prompt = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    return trace_generate(graphdef, state, prompt, max_new_tokens=8).lower(lowering_platforms=(platform,)).as_text()
