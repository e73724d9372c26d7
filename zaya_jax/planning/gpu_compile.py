"""Compile the configured train step for a GPU target on any host (deviceless AOT; docs/planner.md "Compiling for a
GPU without one").

`compile_step(config, target, nodes=, gpus_per_node=)` lowers the project's train step (`abstract_step.
lower_train_step`, nothing allocated) on a mesh over the compile-only devices of `nodes` × `gpus_per_node` GPUs
(`gpu_target.topology_devices`), with the model's kernels resolved for the target's platform, and compiles it with
XLA's real GPU compiler and the platform's flags (`gpu_target.xla_flags`, those launch/<platform>/env.sh sets).
The result carries the GPU binary, the scheduled HLO and the buffer assignment, so what it reports is what the
compiler makes of the step: memory per device against the HBM, kernel choice (expert GEMMs, attention), fusion
and the collective schedule. Without a device nothing is autotuned: GEMM tiling is the compiler's default, so
per-kernel speed is not known.
"""

from __future__ import annotations

import dataclasses
import re
import time

import jax
import ml_collections

from zaya_jax import kernels
from zaya_jax.planning import gpu_program, gpu_target, hlo_stats
from zaya_jax.planning.abstract_step import lower_train_step

GB = 1e9


@dataclasses.dataclass
class GpuCompileResult:
    target: str
    platform: str
    topology: str  # nodes x gpus per node
    mesh: dict
    ok: bool
    error: str = ""
    lower_s: float = 0.0
    compile_s: float = 0.0
    memory: dict = dataclasses.field(default_factory=dict)  # bytes per device: argument, output, alias, temp, peak
    hbm_bytes: float = 0.0
    usable_bytes: float = 0.0
    program: dict = dataclasses.field(default_factory=dict)  # gpu_program.GpuProgram.as_dict()
    expert_flops_executed: float = 0.0  # per device per step
    expert_flops_routed: float = 0.0
    dot_flops: float = 0.0  # per device per step (trip counts applied)
    hbm_traffic_bytes: float = 0.0  # operands + results of the top-level kernels per step (hlo_stats, trips applied)
    xla_cost_bytes_accessed: float = 0.0  # XLA's HLO cost analysis of the compiled module (loop bodies once)
    flags: tuple = ()
    kernels: str = ""  # the kernels the model resolved to for the target (`zaya_jax.kernels.describe`)
    grouped_gemm: str = ""  # the grouped-GEMM kernel the step runs; "" under a capacity dispatch (`_grouped_gemm`)
    notes: list = dataclasses.field(default_factory=list)
    hlo_text: str = dataclasses.field(default="", repr=False)

    @property
    def peak(self) -> float:
        return self.memory.get("peak", 0.0)

    @property
    def fits(self) -> bool:
        return self.ok and self.peak <= self.usable_bytes

    @property
    def expert_ratio(self) -> float:
        return self.expert_flops_executed / self.expert_flops_routed if self.expert_flops_routed else 0.0

    def line(self) -> str:
        """`compiled for h100: ok (peak 30.6 GB of 80.0 GB; expert FLOPs executed/routed 1.00 (tokamax); attention
        cudnn; S×S buffers 0; async collectives with GEMMs between 0/3; 48.4 s)`; in parentheses the grouped-GEMM
        kernel the model resolved to."""
        if not self.ok:
            return f"compiled for {self.target}: FAILED ({self.error}; {self.lower_s + self.compile_s:.1f} s)"
        status = "ok" if self.fits else "DOES NOT FIT"
        p = self.program
        return (
            f"compiled for {self.target}: {status} (peak {self.peak / GB:.1f} GB of {self.hbm_bytes / GB:.1f} GB; "
            f"expert FLOPs executed/routed {self.expert_ratio:.2f}{self._grouped()}; attention {p['attention']}; "
            f"S×S buffers {len(p['square_buffers'])}; async collectives with GEMMs between "
            f"{p['async_with_gemms']}/{p['async']}; {self.lower_s + self.compile_s:.1f} s)"
        )

    def _grouped(self) -> str:
        return f" ({self.grouped_gemm})" if self.grouped_gemm else ""

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("hlo_text")
        return out | {"peak": self.peak, "fits": self.fits, "expert_ratio": self.expert_ratio}


def for_target(config: ml_collections.ConfigDict, target: gpu_target.GpuTarget) -> ml_collections.ConfigDict:
    """A copy of `config` whose kernels resolve for the target's platform (`model.kernels.platform`)."""
    cfg = ml_collections.ConfigDict(config.to_dict())
    cfg.model.kernels.platform = target.platform
    return cfg


def routed_expert_flops(config: ml_collections.ConfigDict, num_devices: int) -> float:
    """Expert-GEMM FLOPs per device per step of the routed tokens only (top-1, no padding): gate, up and down
    projections forward, twice that backward, once more when remat recomputes the forward."""
    m, t = config.model, config.train
    tokens = t.global_batch_size * t.seq_len / num_devices
    passes = 4 if m.remat in ("full", "dots_no_batch") else 3
    return 2 * 3 * m.hidden_size * m.moe_intermediate_size * m.num_layers * tokens * passes


def _grouped_gemm(cfg: ml_collections.ConfigDict) -> str:
    """The grouped-GEMM kernel `cfg`'s step runs: the resolved one under the dropless and ep_ragged dispatches (`auto`
    is dropless without an expert axis > 1, `zaya_jax.model.moe.resolve_dispatch`), else "" (capacity buffers,
    batched GEMMs)."""
    dispatch = cfg.model.dispatch
    if dispatch == "auto":
        dispatch = "ep" if int(cfg.mesh.expert) > 1 else "dropless"
    return kernels.resolve(cfg.model).grouped_gemm if dispatch in ("dropless", "ep_ragged") else ""


def _expert_tag(op_name: str) -> str:
    return "expert" if gpu_program.is_expert(op_name) else "other"


def _expert_executed(hlo: hlo_stats.HloStats, lowerings: dict[str, int], routed: float) -> float:
    """Executed expert-GEMM FLOPs per device: the counted dense dots / GEMM calls, plus, for grouped GEMM calls
    and Pallas ragged dots (which run only the rows routed to each expert, known at run time), their share of the
    routed FLOPs."""
    grouped = sum(n for kind, n in lowerings.items() if kind.startswith("grouped "))
    share = grouped / sum(lowerings.values()) if grouped else 0.0
    return hlo.dot_flops_by_tag.get("expert", 0.0) + share * routed


def _xla_cost_bytes(compiled) -> float:
    """XLA's HLO cost analysis of the compiled module (run with the CPU client: a generic model, loop bodies
    once); 0 when this jaxlib cannot run it."""
    try:
        import jax
        from jax._src.lib import _jax

        module = compiled.runtime_executable().hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
        return float(cost.get("bytes accessed", 0.0))
    except Exception:  # noqa: BLE001 - an optional figure; the report says 0 when it is unavailable
        return 0.0


def _compile(lowered, options: dict, notes: list[str]):
    """`lowered.compile(compiler_options=options)`; an option the per-compile API does not know (a flag only XLA's
    flag parser takes) is dropped with a note, and the compile retried (a child process with $XLA_FLAGS gets it)."""
    while True:
        try:
            return lowered.compile(compiler_options=options or None)
        except Exception as err:  # noqa: BLE001 - jaxlib raises JaxRuntimeError; anything else is re-raised below
            m = re.search(r"No such compile option: '([\w.]+)'", str(err))
            if m is None or m.group(1) not in options:
                raise
            options = {k: v for k, v in options.items() if k != m.group(1)}
            notes.append(f"--{m.group(1)} is not a per-compile option: set it in $XLA_FLAGS to apply it")


def compile_step(
    config: ml_collections.ConfigDict,
    target: str | gpu_target.GpuTarget,
    *,
    nodes: int = 1,
    gpus_per_node: int | None = None,
    usable_fraction: float = 0.95,
    extra_flags: tuple[str, ...] = (),
) -> GpuCompileResult:
    """Compile `config`'s train step (mesh `config.mesh`, which must use nodes × gpus_per_node devices; default
    gpus_per_node: the mesh size when nodes == 1, else 8) for `target`; see the module docstring. A compile
    that fails returns ok=False with the error's first line (a crash inside XLA ends the process: run it in a
    child process to survive one, as `launch.gpu_check` does). Raises a one-line ConfigError for an unknown target
    or when the compile-only devices cannot be made (`gpu_target.topology_devices`: a process with
    JAX_PLATFORMS=cpu and the `gpu-compile` extra)."""
    target = gpu_target.get_target(target) if isinstance(target, str) else target
    n_mesh = 1
    for axis in ("data", "context", "expert"):
        n_mesh *= max(int(config.mesh[axis]), 1)
    gpus = gpus_per_node or (n_mesh if nodes == 1 else 8)
    flags = tuple(gpu_target.xla_flags(target.platform)) + tuple(extra_flags)
    result = GpuCompileResult(
        target.name,
        target.platform,
        f"{nodes}x{gpus}",
        dict(config.mesh),
        ok=False,
        hbm_bytes=target.hbm_bytes,
        usable_bytes=usable_fraction * target.hbm_bytes,
        flags=flags,
    )
    devices = gpu_target.topology_devices(target, nodes, gpus)
    cfg = for_target(config, target)
    result.kernels = kernels.describe(cfg.model)  # as the model will resolve them, reason for a stand-in included
    result.grouped_gemm = _grouped_gemm(cfg)
    t0 = time.perf_counter()
    try:
        with jax.default_device(devices[0]):  # a library asking the default device (tokamax) sees the target
            lowered, mesh, _ = lower_train_step(cfg, devices)
        t1 = time.perf_counter()
        result.lower_s = t1 - t0
        compiled = _compile(lowered, gpu_target.compiler_options(target.platform, extra_flags), result.notes)
    except Exception as err:  # noqa: BLE001 - a failed compile is the finding; report it in one line
        result.error = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
        result.compile_s = time.perf_counter() - t0 - result.lower_s
        return result
    result.compile_s = time.perf_counter() - t1
    result.mesh = dict(mesh.shape)
    stats = compiled.memory_analysis()
    names = ("argument", "output", "alias", "temp", "generated_code")
    memory = {k: float(getattr(stats, f"{k}_size_in_bytes", 0) or 0) for k in names}
    memory["peak"] = memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
    text = compiled.as_text()
    hlo = hlo_stats.analyze(text, mesh.size, classify=_expert_tag)
    result.ok = True
    result.memory = memory
    result.program = gpu_program.analyze_program(text, int(cfg.train.seq_len)).as_dict()
    result.expert_flops_routed = routed_expert_flops(cfg, mesh.size)
    result.expert_flops_executed = _expert_executed(hlo, result.program["expert_gemms"], result.expert_flops_routed)
    result.dot_flops = hlo.dot_flops
    result.hbm_traffic_bytes = hlo.hbm_bytes
    result.xla_cost_bytes_accessed = _xla_cost_bytes(compiled)
    result.hlo_text = text
    return result
