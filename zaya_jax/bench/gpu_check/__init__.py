"""The first-contact check of an accelerator (`python -m launch.gpu_check --out=DIR`; benchmarks/gpu/README.md).

Five sections, each a module returning report rows (`report`), each timed:

1. `environment` — device, driver / runtime, jax / plugin versions, XLA_FLAGS and environment, resolved kernels;
2. `peaks` — bf16 GEMM peak and HBM bandwidth (the project's microbenchmarks);
3. `parity` — 10 tiny-config steps on the accelerator against the same steps in fp32 on the CPU;
4. `throughput` — train-step time, tokens/s and MFU of configs that fill one GPU, per grouped-GEMM and attention
   kernel, and each grouped kernel's MoE block against the equal-FLOPs dense block;
5. `memory` — compiled peak memory and compile time against the planner's prediction.

They run in the order 1, 2, 4, 3, 5: the CPU side (the parity reference, then the planner) runs in a process of
its own meanwhile (`jobs`). `run(options)` writes DIR/report.md and DIR/report.csv and returns the number of failed
checks. `smoke=True` runs every section at CPU sizes (the tiny config, the kernels XLA:CPU runs, 1–2 timing
trials) so CI keeps the script working. A real run is sized for at most 8 minutes on one H100 / H200 / MI300X;
cases other than the defaults that would start after `budget_s` are recorded as skipped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax

from zaya_jax import kernels
from zaya_jax.bench import common
from zaya_jax.bench.gpu_check import cases, environment, jobs, memory, parity, peaks, report, throughput

__all__ = ["Options", "run"]


@dataclasses.dataclass(frozen=True)
class Options:
    """out_dir: where report.md / report.csv go; smoke: CPU sizes; configs: names of `cases.FILL_CONFIGS`;
    budget_s: wall-time budget after which non-default cases are skipped; job_command: argv prefix that runs a
    job in a fresh process (`jobs`), None = everything in this process (allowed on a CPU-only host only);
    command: the command line recorded in the report; child_env: environment the accelerator cases' processes
    get on top of this one's (the launcher turns preallocation off in this process, back on for them)."""

    out_dir: str
    smoke: bool = False
    configs: tuple[str, ...] = tuple(cases.FILL_CONFIGS)
    budget_s: float = 320.0
    job_command: tuple[str, ...] | None = None
    command: str | None = None
    child_env: tuple[tuple[str, str], ...] = ()


def _settings(options: Options) -> tuple[list[cases.ConfigRef], peaks.PeakSizes, throughput.Timing]:
    if options.smoke:
        return [cases.SMOKE_CONFIG], peaks.SMOKE_PEAKS, throughput.Timing(1, 2, fast_compile=True)
    unknown = sorted(set(options.configs) - set(cases.FILL_CONFIGS))
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {sorted(cases.FILL_CONFIGS)}")
    return [cases.FILL_CONFIGS[c] for c in options.configs], peaks.PeakSizes(), throughput.Timing()


def _case_runner(options: Options, platform: str, gemm_peak: float, sheet_peak, timing, log) -> Callable:
    """Measures a throughput case: in this process on a CPU-only host; on an accelerator host in a fresh process
    (its own device memory and XLA_FLAGS — the grouped-lowering flag as the case wants it — and the
    preallocation the user set, `Options.child_env`), so one case's failure or memory cannot affect the next."""
    on_cpu = jax.default_backend() == "cpu"
    flag = cases.GROUPED_LOWERING_FLAG.get(platform)

    def execute(p: throughput.Planned) -> list[dict]:
        log(f"gpu_check:   {p.label}")
        if on_cpu and not p.subprocess:
            return throughput.measure(p, gemm_peak, sheet_peak, timing)
        spec = dict(
            config=dataclasses.asdict(p.config),
            case=dataclasses.asdict(p.case),
            label=p.label,
            default=p.default,
            gemm_peak=gemm_peak,
            sheet_peak=sheet_peak,
            timing=dataclasses.asdict(timing),
        )
        env = dict(options.child_env)
        if flag and p.case.lowering is not None:
            env["XLA_FLAGS"] = cases.with_flag(flag, p.case.lowering)
        try:
            return jobs.start("throughput_case", spec, command=options.job_command, env=env).result()
        except Exception as err:  # noqa: BLE001 — the case's row carries the error
            check = report.FAIL if p.default else report.ERROR
            return [report.row("throughput", p.label, "error", "", check=check, note=report.one_line(err))]

    return execute


def run(options: Options, log: Callable[[str], None] = print) -> int:
    """Run the five sections, write the report; returns the number of failed checks."""
    t0 = time.monotonic()
    configs, peak_sizes, timing = _settings(options)
    on_cpu = jax.default_backend() == "cpu"
    cpu_command = None if on_cpu else options.job_command  # CPU work in a CPU-only process on accelerator hosts
    cpu_env = None if on_cpu else {"JAX_PLATFORMS": "cpu"}
    cpu_spec = dict(
        steps=parity.STEPS,
        fast_compile=timing.fast_compile,
        configs=[dataclasses.asdict(c) for c in configs],
        hardware=memory.hardware_name(),
    )
    cpu_side = jobs.start("cpu_side", cpu_spec, command=cpu_command, env=cpu_env)
    tiny_model = cases.SMOKE_CONFIG.load().model
    platform = kernels.resolve(tiny_model).platform
    found: dict = {}

    def measure_peaks(s: report.Section) -> None:
        found["gemm_peak"] = peaks.run(s, peak_sizes)

    def measure_parity(s: report.Section) -> None:
        parity.run(s, lambda: cpu_side.result()["reference"], timing.fast_compile)

    def measure_throughput(s: report.Section) -> None:
        gemm_peak, sheet = found.get("gemm_peak", 0.0), peaks.datasheet_peak()
        tokamax = cases.tokamax_importable()
        planned = throughput.plan_cases(configs, platform, tokamax=tokamax)
        if platform != "cpu" and not tokamax:
            s.notes.append(
                "tokamax is not importable here: its grouped-GEMM case is left out (pip install 'tokamax>=0.0.17')"
            )
        execute = _case_runner(options, platform, gemm_peak, sheet, timing, log)
        throughput.run(s, planned, execute, t0 + options.budget_s)

    def measure_memory(s: report.Section) -> None:
        measured = next(x.rows for x in done if x.key == "throughput")
        plans = {c.name: (lambda name=c.name: cpu_side.result()["plans"][name]) for c in configs}
        memory.run(s, configs, plans, measured)

    order = (  # executed in this order (parity after the long section: the CPU reference runs meanwhile)
        ("environment", "1. Device, versions, environment, kernels", lambda s: environment.run(s, tiny_model)),
        ("peaks", "2. bf16 GEMM peak and HBM bandwidth", measure_peaks),
        ("throughput", "4. Train step per kernel: time, tokens/s, MFU", measure_throughput),
        ("parity", "3. Loss parity: accelerator vs CPU fp32", measure_parity),
        ("memory", "5. Compiled memory and compile time vs the planner", measure_memory),
    )
    done: list[report.Section] = []
    for key, title, body in order:
        done.append(report.timed(key, title, body, log))
    sections = sorted(done, key=lambda s: s.title)  # reported by number
    title = f"GPU check{' (smoke)' if options.smoke else ''}: {common.device_description()}"
    report.write(options.out_dir, title, sections, command=options.command)
    failed = sum(len(s.failures) for s in sections)
    log(f"gpu_check: wrote {options.out_dir}/report.md, report.csv: {failed} failed check(s)")
    return failed
