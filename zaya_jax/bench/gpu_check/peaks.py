"""Section 2: bf16 GEMM peak and HBM bandwidth, by the project's microbenchmarks (`zaya_jax.bench.gemm`,
`zaya_jax.bench.membw`), next to the device's data-sheet figures (`zaya_jax.hardware.HARDWARE`).

The measured GEMM peak is the achievable ceiling section 4 computes one of its two MFUs against.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from zaya_jax.bench import gemm, membw
from zaya_jax.bench.gpu_check.report import Section, sig
from zaya_jax.hardware import hardware_for_device, peak_flops


@dataclasses.dataclass(frozen=True)
class PeakSizes:
    """Square GEMM sizes (the best one is the peak), the array size of the bandwidth kernels, and trials."""

    gemm_sizes: tuple[int, ...] = (4096, 8192)
    membw_bytes: int = 1 << 30  # 1 GiB: well above the last-level cache (MI300X Infinity Cache 256 MB)
    warmup: int = 2
    trials: int = 5


SMOKE_PEAKS = PeakSizes(gemm_sizes=(128, 256), membw_bytes=1 << 20, warmup=1, trials=2)


def datasheet_peak() -> float | None:
    """Dense bf16 FLOP/s of this device from the hardware table (H100 / H200 989, MI300X 1307 TFLOP/s); None
    for devices it does not know (CPU)."""
    return peak_flops(jax.devices()[0].device_kind, "bfloat16")


def run(section: Section, sizes: PeakSizes) -> float:
    """Rows per GEMM size and bandwidth kernel; returns the measured bf16 GEMM peak in FLOP/s."""
    best = 0.0
    for size in sizes.gemm_sizes:
        peak = gemm.measure_gemm_peak(jnp.bfloat16, size=size, warmup=sizes.warmup, trials=sizes.trials)
        section.add(f"gemm bf16 {size}^3", "tflops_best", sig(peak / 1e12), "TFLOP/s")
        best = max(best, peak)
    sheet = datasheet_peak()
    section.add("gemm bf16 peak", "tflops_best", sig(best / 1e12), "TFLOP/s")
    if sheet:
        section.add("gemm bf16 peak", "datasheet", sig(sheet / 1e12), "TFLOP/s")
        section.add("gemm bf16 peak", "fraction_of_datasheet", sig(best / sheet))
    hw = hardware_for_device(jax.devices()[0].device_kind)
    rows = membw.benchmark(
        ("copy", "triad"),
        min_bytes=sizes.membw_bytes,
        max_bytes=sizes.membw_bytes,
        warmup=sizes.warmup,
        trials=sizes.trials,
    )
    for r in rows:  # membw checks each kernel against NumPy first (AssertionError = a failed section)
        case = f"{r['kernel']} {r['array_bytes'] >> 20} MiB f32"
        section.add(case, "GBps_best", sig(r["GBps_best"]), "GB/s")
        section.add(case, "GBps_median", sig(r["GBps"]), "GB/s")
        if hw is not None:
            section.add(case, "fraction_of_datasheet", sig(r["GBps_best"] * 1e9 / hw.hbm_bandwidth))
    if hw is not None:
        section.notes.append(f"data sheet: {hw.describe()}")
    else:
        section.notes.append(f"no data-sheet entry for {jax.devices()[0].device_kind!r}: only measured figures")
    return best
