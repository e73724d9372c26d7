"""Section 5: the compiled step's peak memory and compile time on this device against what the planner predicts
for the same config on one device (`zaya_jax.planning.plan.plan`, what `python -m launch.plan --mesh=data:1` prints).

The planner compiles on the CPU (XLA:CPU, the kernels `auto` picks there), so it runs in a CPU-only process; its
`peak` is that program's, `peak_without_cpu_copies` its estimate for a bf16 accelerator (without the fp32 copies
of bf16 parameters only XLA:CPU makes). The compiled figures are the default case's of section 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax

from zaya_jax.bench.gpu_check.cases import ConfigRef
from zaya_jax.bench.gpu_check.report import Section, sig
from zaya_jax.hardware import get_hardware, hardware_for_device
from zaya_jax.planning import hlo_text
from zaya_jax.planning.abstract_step import FAST_COMPILE, lower_train_step, planning_config
from zaya_jax.planning.plan import compiled_memory

GiB = 2**30


def hardware_name() -> str:
    """The hardware-table entry of this device (the planner's capacity and peaks); MI300X when unknown."""
    hw = hardware_for_device(jax.devices()[0].device_kind)
    return hw.name.lower() if hw is not None else "mi300x"


def planned_memory(config: ConfigRef, hardware: str) -> dict:
    """The planner's memory figures for `config` on one (CPU) device, keeping its dispatch, capacity factor and
    batch: `planning_config`, the step lowered on abstract state (`lower_train_step`), compiled as the
    planner compiles it, read as `plan.plan` reads it (peak; peak without XLA:CPU's fp32 parameter copies).
    Not `plan.plan` itself: its collective ratio divides by the ZeRO-1 minimum, which is 0 on one device."""
    cfg = config.load()
    cfg, _ = planning_config(
        cfg,
        mesh={"data": 1},
        batch_per_device=cfg.train.global_batch_size // cfg.train.microbatches,
        dispatch=None,
        capacity_factor=None,
        num_devices=1,
    )
    t0 = time.perf_counter()
    lowered, _, _ = lower_train_step(cfg, jax.devices()[:1])
    compiled = lowered.compile(compiler_options=FAST_COMPILE)
    seconds = time.perf_counter() - t0
    mem = compiled_memory(compiled)  # the planner's reading of memory_analysis()
    copies = hlo_text.widened_parameter_bytes(compiled.as_text())
    return {
        "peak": mem["peak"],
        "peak_without_cpu_copies": mem["peak"] - copies,
        "usable": 0.95 * get_hardware(hardware).memory_bytes,
        "plan_s": seconds,
    }


def _value(rows: Sequence[dict], case: str, metric: str) -> float | None:
    for r in rows:
        if r["case"] == case and r["metric"] == metric and r["value"] != "":
            return float(r["value"])
    return None


def _default_case(rows: Sequence[dict], config: str) -> str | None:
    """The label of `config`'s default case in section 4's rows."""
    labels = (r["case"] for r in rows if r["case"].startswith(config + " ") and r["case"].endswith("(default)"))
    return next(labels, None)


def run(section: Section, configs: Sequence[ConfigRef], plans: dict[str, Callable[[], dict]], measured: list) -> None:
    """Rows per config: compiled peak and compile time (section 4's default case) next to the plan's."""
    for config in configs:
        default = _default_case(measured, config.name)
        predicted = plans[config.name]()
        compiled = _value(measured, default, "compiled_peak") if default else None
        add = section.add
        add(config.name, "planned_peak", sig(predicted["peak"] / GiB), "GiB")
        add(config.name, "planned_peak_accelerator", sig(predicted["peak_without_cpu_copies"] / GiB), "GiB")
        add(config.name, "plan_s", sig(predicted["plan_s"]), "s", note="lower + compile on the CPU")
        if compiled is None:
            add(config.name, "compiled_peak", "", note="the default case did not compile (section 4)")
            continue
        add(config.name, "compiled_peak", compiled, "GiB")
        add(config.name, "compiled_over_planned", sig(compiled * GiB / predicted["peak"]))
        add(
            config.name,
            "compiled_over_planned_accelerator",
            sig(compiled * GiB / predicted["peak_without_cpu_copies"]),
        )
        for metric in ("setup_s", "compile_s"):
            value = _value(measured, default, metric)
            if value is not None:
                add(config.name, metric, value, "s")
    section.notes.append(__doc__.split("\n\n", 1)[1].replace("\n", " "))
