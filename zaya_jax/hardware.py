"""The accelerators the project sizes and measures for: data-sheet peaks, HBM bandwidth and capacity.

Below every package that reads it: the training loop's MFU denominator (`peak_flops`), the sizing rules
(`zaya_jax.planning.sizing`), the planner and the GPU first-contact check (`zaya_jax.bench.gpu_check`).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator. `vendor_spec` lists the fields that are vendor data-sheet numbers."""

    name: str
    vendor: str
    peak_bf16_flops: float  # dense (no sparsity) bf16 matrix peak, FLOP/s
    hbm_bandwidth: float  # peak HBM bandwidth, bytes/s
    memory_bytes: float  # HBM capacity, bytes
    vendor_spec: tuple[str, ...] = ("peak_bf16_flops", "hbm_bandwidth", "memory_bytes", "peak_fp32_flops")
    notes: str = ""
    peak_fp32_flops: float = 0.0  # dense fp32 matrix peak (MI300X: FP32 matrix cores; NVIDIA: FP32 CUDA cores)

    @property
    def ridge(self) -> float:
        """Roofline ridge point in FLOP/byte (bf16 peak / HBM bandwidth); MI300X ~ 247."""
        return self.peak_bf16_flops / self.hbm_bandwidth

    def describe(self) -> str:
        def tag(field: str) -> str:
            return " [vendor spec]" if field in self.vendor_spec else " [estimate]"

        fp32 = f", fp32 {self.peak_fp32_flops / 1e12:.1f}{tag('peak_fp32_flops')}" if self.peak_fp32_flops else ""
        return (
            f"{self.name}: dense bf16 {self.peak_bf16_flops / 1e12:.1f} TFLOP/s{tag('peak_bf16_flops')}{fp32}, "
            f"HBM {self.hbm_bandwidth / 1e12:.2f} TB/s{tag('hbm_bandwidth')}, "
            f"{self.memory_bytes / 1e9:.0f} GB{tag('memory_bytes')}, ridge {self.ridge:.0f} FLOP/B"
        )


HARDWARE: dict[str, Hardware] = {
    h.name.lower(): h
    for h in (
        Hardware(
            "MI300X",
            "AMD",
            1307.4e12,
            5.3e12,
            192e9,
            peak_fp32_flops=163.4e12,
            notes="CDNA3, 304 CUs, 256 MB Infinity Cache, 7 xGMI links (AMD's public specifications)",
        ),
        Hardware("MI325X", "AMD", 1307.4e12, 6.0e12, 256e9, peak_fp32_flops=163.4e12, notes="CDNA3, HBM3E"),
        Hardware("MI355X", "AMD", 2516.6e12, 8.0e12, 288e9, peak_fp32_flops=157.3e12, notes="CDNA4, HBM3E, 1.4 kW"),
        Hardware("H100", "NVIDIA", 989.4e12, 3.35e12, 80e9, peak_fp32_flops=66.9e12, notes="SXM5, HBM3"),
        Hardware("H200", "NVIDIA", 989.4e12, 4.8e12, 141e9, peak_fp32_flops=66.9e12, notes="SXM, HBM3E"),
    )
}


def get_hardware(name: str | Hardware) -> Hardware:
    """Look up a `Hardware` by case-insensitive name (`mi300x`, `H100`, ...)."""
    if isinstance(name, Hardware):
        return name
    key = str(name).strip().lower()
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return HARDWARE[key]


def hardware_for_device(device_kind: str) -> Hardware | None:
    """The table entry whose name appears in a `jax.Device.device_kind` (e.g. "AMD Instinct MI300X",
    "NVIDIA H100 80GB HBM3"); None for devices the table does not know (CPU, other accelerators)."""
    kind = device_kind.lower().replace(" ", "")
    return next((h for key, h in HARDWARE.items() if key in kind), None)


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """Dense matrix peak FLOP/s of one device of `device_kind` for compute dtype `dtype` ("bfloat16" |
    "float32"); None when the table has no entry (then MFU needs a measured peak: `launch.bench --suite=gemm`)."""
    hw = hardware_for_device(device_kind)
    if hw is None:
        return None
    peak = hw.peak_bf16_flops if dtype == "bfloat16" else hw.peak_fp32_flops
    return peak or None
