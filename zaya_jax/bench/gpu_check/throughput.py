"""Section 4: train-step time, tokens/s and MFU per kernel case, and each grouped-GEMM kernel's MoE block
against the dense SwiGLU block of equal active FLOPs (`zaya_jax.bench.moe.time_moe`, as `launch.bench --suite=moe`).

MFU = tokens/s × model FLOPs per token (`zaya_jax.model.flops.train_flops_per_token`: 6·N_active + causal
attention) ÷ a bf16 peak: the GEMM peak measured in section 2 (`mfu_measured`) and the data sheet's
(`mfu_datasheet`: H100 / H200 989, MI300X 1307 TFLOP/s). The case `auto` resolves to on this host is marked
`(default)`: if it fails to compile or run, or its loss is not finite, the check fails; any other kernel that
fails is a row with its one-line error.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax

from zaya_jax import kernels
from zaya_jax.bench import moe
from zaya_jax.bench.gpu_check import cases as cases_lib
from zaya_jax.bench.gpu_check import steps
from zaya_jax.bench.gpu_check.report import ERROR, FAIL, PASS, Section, one_line, row, sig
from zaya_jax.model.flops import train_flops_per_token

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Timing:
    """Untimed warm-up steps (the first one compiles nothing: the step is compiled ahead of time), timed ones, and
    whether steps are compiled without LLVM optimisation (`steps.build`; smoke runs)."""

    warmup: int = 1
    trials: int = 3
    fast_compile: bool = False


@dataclasses.dataclass(frozen=True)
class Planned:
    """One case of one config, as planned by `plan_cases`."""

    config: cases_lib.ConfigRef
    case: cases_lib.Case
    label: str  # "<config> <case>[ (default)]"
    default: bool
    subprocess: bool  # needs XLA_FLAGS other than this process's


def _signature(config: cases_lib.ConfigRef, case: cases_lib.Case, platform: str) -> tuple:
    """What actually runs: resolved kernels, dispatch (auto = dropless on one device), and the lowering flag's
    state where it matters (a dropless `ragged_dot` / `ragged_dot_bf16`)."""
    m = config.load(case.overrides).model
    chosen = kernels.resolve(m)
    flag = cases_lib.GROUPED_LOWERING_FLAG.get(platform)
    lowering = case.lowering if case.lowering is not None else bool(flag and cases_lib.flag_state(flag))
    dispatch = "dropless" if m.dispatch == "auto" else m.dispatch
    grouped = chosen.grouped_gemm if dispatch == "dropless" else "-"
    return chosen.attention, chosen.matmul, dispatch, grouped, lowering and grouped.startswith("ragged_dot")


def plan_cases(configs: list[cases_lib.ConfigRef], platform: str, *, tokamax: bool) -> list[Planned]:
    """Every config's distinct kernel cases; the one `auto` runs on this host is marked default. Order: the defaults
    of all configs, then the others kernel by kernel (each config in turn), so a time budget cuts the last
    alternatives, never a default, and every kernel gets a first config early."""
    kinds = cases_lib.kernel_cases(platform, tokamax=tokamax)
    defaults, others = [], []
    for rank, config in enumerate(configs):
        auto = _signature(config, cases_lib.Case("auto", ()), platform)
        seen = set()
        for order, case in enumerate(kinds):
            try:
                sig = _signature(config, case, platform)
            except Exception:  # noqa: BLE001 — a config the case cannot build: `measure` reports its error
                sig = ("unresolved", case.label)
            if sig in seen:
                continue
            seen.add(sig)
            default = sig == auto
            label = f"{config.name} {case.label}" + (" (default)" if default else "")
            planned = Planned(config, case, label, default, cases_lib.needs_subprocess(case, platform))
            (defaults if default else others).append((order, rank, planned))
    return [p for *_, p in defaults] + [p for *_, p in sorted(others, key=lambda x: x[:2])]


def measure(planned: Planned, gemm_peak: float, sheet_peak: float | None, timing: Timing) -> list[dict]:
    """Rows of one case: setup / compile seconds, step time, tokens/s, MFUs, loss, dropped fraction, compiled
    memory, and (grouped cases) the MoE block / dense block ratio. Errors become one row (see module doc)."""
    key, label = "throughput", planned.label

    def add(metric: str, value: Any, unit: str = "", check: str = "", note: str = "") -> None:
        rows.append(row(key, label, metric, value, unit, check, note))

    rows: list[dict] = []
    run = None
    try:
        config = planned.config.load(planned.case.overrides)
        t, m = config.train, config.model
        add("kernels", str(kernels.resolve(m)), note=f"dispatch={m.dispatch}")
        run = steps.build(config, timing.fast_compile)
        add("setup_s", sig(run.setup_s), "s")
        add("compile_s", sig(run.compile_s), "s")
        add("compiled_peak", sig(run.memory()["peak"] / GiB), "GiB")
        timed, metrics = run.time(timing.warmup, timing.trials)
        tokens = t.global_batch_size * t.seq_len
        flops = train_flops_per_token(m, t.seq_len) * tokens / timed.median
        add("step_s_median", sig(timed.median), "s")
        add("step_s_min", sig(timed.min), "s")
        add("tokens_per_s", sig(tokens / timed.median), "tok/s")
        add("model_tflops", sig(flops / 1e12), "TFLOP/s")
        add("mfu_measured", sig(flops / gemm_peak) if gemm_peak else float("nan"))
        add("mfu_datasheet", sig(flops / sheet_peak) if sheet_peak else float("nan"))
        loss = float(metrics["loss"])
        finite = math.isfinite(loss)
        bad = FAIL if planned.default else ERROR
        add("loss", sig(loss, 6), check=PASS if finite else bad, note="" if finite else "loss is not finite")
        add("dropped_fraction", sig(float(metrics["dropped_fraction"].mean())))
        run.release()
        if planned.case.grouped:
            block = moe.time_moe(m, tokens, m.dispatch, jax.devices()[:1], timing.warmup, timing.trials)
            add("moe_block_s", sig(block["moe_s_median"]), "s")
            add("dense_block_s", sig(block["dense_s_median"]), "s")
            add("moe_over_dense", sig(block["ratio_vs_dense"]), note="MoE block / equal-FLOPs dense block")
    except Exception as err:  # noqa: BLE001 — a kernel that fails is a row, not a crash of the command
        add("error", "", check=FAIL if planned.default else ERROR, note=one_line(err))
    finally:
        steps.release_all([run])
    return rows


def run(section: Section, planned: list[Planned], execute: Callable[[Planned], list[dict]], deadline: float) -> None:
    """Measure every planned case with `execute` (`measure` here or in a process of its own); cases not started
    before `deadline` (time.monotonic) are recorded as skipped — defaults always run."""
    for p in planned:
        if not p.default and time.monotonic() > deadline:
            section.add(p.label, "skipped", "", note="over the time budget (--budget_s)")
            continue
        section.rows.extend(execute(p))
    section.notes.append(
        "MFU = tokens/s x model FLOPs per token (6 N_active + causal attention) / bf16 peak: measured (section 2) "
        "and data sheet; compiled_peak = argument + output - aliased + temporary bytes of the compiled step"
    )
    section.notes.append(
        "moe_over_dense: the model's MoE block (router + dispatch + experts) forward + backward / a SwiGLU MLP "
        "of equal active FLOPs, same tokens (zaya_jax.bench.moe)"
    )
