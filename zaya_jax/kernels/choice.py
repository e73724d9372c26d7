"""Which kernel runs each platform-specific piece, chosen once (`model.kernels`, docs/kernels.md).

`resolve(model_cfg)` turns `model.kernels` into a `Kernels` of concrete names when the model is built. `platform`
is the target the program is built for: "auto" means the platform of the devices this process runs on; a CPU
host lowering a program for a GPU names it (`model.kernels.platform=rocm`). Each kernel's "auto" then follows
`AUTO` below; an explicit name always wins. Model code never asks which backend it runs on: it calls the
`Kernels` it was built with.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata

import jax
import ml_collections
from packaging.requirements import Requirement
from packaging.version import Version

from zaya_jax.kernels import attention as attention_kernels
from zaya_jax.kernels import matmul as matmul_kernels
from zaya_jax.kernels import ragged_exchange
from zaya_jax.kernels.grouped import ExpertWeights, dropless_swiglu

# platform → (matmul, grouped_gemm, attention) for "auto", and why:
AUTO = {
    # XLA:CPU: bf16 GEMMs only run fast in the forward layout; ragged_dot is a dense masked dot (E× the work)
    "cpu": ("xla_cpu", "loops", "xla"),
    # CUDA: cuBLAS picks layouts; tokamax's grouped GEMM (Mosaic GPU kernels on H100, forward and backward: only
    # the routed rows) where the installed tokamax can build it, else `ragged_dot`, which XLA lowers to dense GEMMs
    # over all experts (E× the routed FLOPs; `tokamax_unusable`); cuDNN flash attention for bf16 (fp32: xla)
    "cuda": ("xla", "tokamax", "cudnn"),
    # ROCm: hipBLASLt; ragged_dot with a compute-dtype (bf16) result, which the grouped-GEMM flag of
    # launch/rocm/env.sh lowers to hipBLASLt's grouped GEMM forward and backward (an fp32 result: a dense GEMM
    # over all experts); jax's Pallas Triton flash attention for bf16 (fp32: xla)
    "rocm": ("xla", "ragged_dot_bf16", "pallas"),
}


# `auto`'s stand-in where its choice cannot run here (the reason: `tokamax_unusable`)
AUTO_FALLBACK = {"tokamax": "ragged_dot"}
# The first tokamax release whose grouped GEMM compiles for an H100 under jax 0.12 (docs/kernels.md): 0.0.12 does
# not trace for a GPU there (its Triton kernel calls the removed `pl.dot`, its Mosaic GPU kernel passes `out_shape`
# to `Mesh`). 0.0.17 needs Python >= 3.12 and jax >= 0.11.1.
TOKAMAX_FOR_GPU = "0.0.17"


@dataclasses.dataclass(frozen=True)
class Kernels:
    """Concrete kernel names for one program (hashable: modules keep it as static structure)."""

    platform: str  # cpu | cuda | rocm
    matmul: str  # xla | xla_cpu
    grouped_gemm: str  # loops | ragged_dot | ragged_dot_bf16 | tokamax
    attention: str  # xla | cudnn | pallas

    def __str__(self) -> str:
        return (
            f"platform={self.platform} matmul={self.matmul} grouped_gemm={self.grouped_gemm} attention={self.attention}"
        )

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ the API model code calls
    def einsum(self, spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
        """Mixed-precision `einsum(spec, a, b)`: `dtype` operands, fp32 result (`zaya_jax.kernels.matmul`)."""
        return matmul_kernels.einsum(spec, a, b, dtype, self.matmul)

    def linear(self, x: jax.Array, w: jax.Array, dtype) -> jax.Array:
        """Mixed-precision `x @ w`: x [..., K], w [K, N] → [..., N] fp32."""
        return matmul_kernels.matmul(x, w, dtype, self.matmul)

    def weight_grad(self, a: jax.Array, g: jax.Array) -> jax.Array:
        """Σ_t a[t]ᵀ g[t] → [K, N] fp32 (the weight gradient of `a @ w`)."""
        return matmul_kernels.weight_grad(a, g, self.matmul)

    def grouped_swiglu(self, x: jax.Array, choice: jax.Array, gate: jax.Array, experts: ExpertWeights) -> jax.Array:
        """Dropless top-1 expert SwiGLU of one device's tokens: x [T, H] → g · expert(x) [T, H] fp32."""
        with jax.named_scope("experts"):  # names the expert GEMMs in compiled HLO (zaya_jax.planning.gpu_program)
            return dropless_swiglu(self.grouped_gemm, x, choice, gate, experts, self.platform)

    def ragged_all_to_all(self, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis: str):
        """`jax.lax.ragged_all_to_all` over mesh axis `axis` inside a manual `shard_map`: one ragged exchange on
        GPUs, a padded dense `all_to_all` with the same result on XLA:CPU (`zaya_jax.kernels.ragged_exchange`)."""
        return ragged_exchange.ragged_all_to_all(
            self.platform, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis
        )

    @property
    def collectives_as_bits(self) -> bool:
        """Whether 2-byte collectives (the ZeRO-1 parameter all-gather) travel as uint16 bits: XLA:CPU runs bf16
        collectives in fp32; GPUs move bf16 as it is."""
        return self.platform == "cpu"

    def takes_expert_stacks(self) -> bool:
        """Whether `grouped_swiglu` reads the decoder's whole [L, E, ...] expert stacks (see `ExpertWeights`)."""
        return self.grouped_gemm == "loops"

    def causal_attention(self, q, k, v, dtype, q_offset: int | jax.Array = 0, chunk: int = 0) -> jax.Array:
        """Grouped-query causal attention: q [B, Sq, n_q, d], k/v [B, Sk, n_kv, d] → [B, Sq, n_q, d] in `dtype`.
        A fused kernel runs the plain full-sequence case; blocks at a traced offset (context parallel), fewer
        queries than keys, or a shape `pallas` cannot tile run the `xla` einsums."""
        with jax.named_scope("attention"):  # names the ops in compiled HLO (zaya_jax.planning.gpu_program)
            plain = isinstance(q_offset, int) and q_offset == 0 and q.shape[1] == k.shape[1]
            if plain and self.attention == "pallas" and attention_kernels.pallas_fits(q.shape[1], q.shape[3]):
                interpret = self.platform == "cpu"
                return attention_kernels.pallas_causal_attention(q, k, v, dtype, interpret=interpret)
            if plain and self.attention == "cudnn":
                return attention_kernels.fused_causal_attention(q, k, v, dtype, self.attention)
            return attention_kernels.causal_attention(q, k, v, dtype, q_offset, chunk, self.matmul)


def current_platform() -> str:
    """The platform of this process's default devices: cpu | cuda | rocm."""
    backend = jax.default_backend()
    if backend in ("cuda", "rocm", "cpu"):
        return backend
    if backend == "gpu":
        version = jax.devices()[0].client.platform_version.lower()
        return "rocm" if "rocm" in version or "hip" in version else "cuda"
    raise ValueError(f"no kernels for the {backend!r} backend (zaya_jax targets cpu, cuda and rocm)")


@functools.cache
def tokamax_unusable() -> str:
    """Why the installed tokamax cannot be CUDA's grouped GEMM, in one line; "" when it can: tokamax >= 0.0.17
    (whose grouped GEMM compiles for a GPU under jax 0.12) and this jax meets tokamax's own jax requirement."""
    install = f"pip install 'tokamax>={TOKAMAX_FOR_GPU}' (Python >= 3.12)"
    try:
        dist = importlib.metadata.distribution("tokamax")
    except importlib.metadata.PackageNotFoundError:
        return f"tokamax is not installed: {install}"
    if Version(dist.version) < Version(TOKAMAX_FOR_GPU):
        return f"tokamax {dist.version} is older than {TOKAMAX_FOR_GPU}, the first that compiles for GPUs: {install}"
    for text in dist.requires or ():
        req = Requirement(text)
        if req.name == "jax" and req.marker is None and not req.specifier.contains(jax.__version__, prereleases=True):
            return f"tokamax {dist.version} needs {req}, this is jax {jax.__version__}"
    return ""


def _requested(m: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`m.kernels`; a config from before `model.kernels` existed counts as all "auto"."""
    return m.get("kernels") or ml_collections.ConfigDict(
        dict(platform="auto", matmul="auto", grouped_gemm="auto", attention="auto")
    )


def _auto(m: ml_collections.ConfigDict) -> tuple[str, dict[str, str], dict[str, str]]:
    """(platform, each kernel's "auto" choice, why a requested "auto" is not AUTO's first choice: {name: reason})."""
    k = _requested(m)
    platform = current_platform() if k.platform == "auto" else k.platform
    defaults = dict(zip(("matmul", "grouped_gemm", "attention"), AUTO[platform]))
    why = {}
    if m.dtype != "bfloat16" and defaults["attention"] != "xla":
        fused = "cuDNN's" if defaults["attention"] == "cudnn" else "Pallas's"
        defaults["attention"], why["attention"] = "xla", f"{fused} fused attention takes bf16 only"
    if defaults["grouped_gemm"] == "tokamax" and (reason := tokamax_unusable()):
        defaults["grouped_gemm"], why["grouped_gemm"] = AUTO_FALLBACK["tokamax"], reason
    return platform, defaults, {name: text for name, text in why.items() if k[name] == "auto"}


def resolve(m: ml_collections.ConfigDict) -> Kernels:
    """The concrete kernels of model config `m` (`m.kernels`, `m.dtype`). Fused attention needs bf16 operands, so
    an fp32 model resolves attention "auto" to `xla` on every platform; CUDA's grouped GEMM "auto" is `tokamax`
    only where `tokamax_unusable()` finds no reason against it, else `ragged_dot`."""
    k = _requested(m)
    platform, defaults, _ = _auto(m)
    chosen = {name: (defaults[name] if k[name] == "auto" else k[name]) for name in defaults}
    return Kernels(platform=platform, **chosen)


def describe(m: ml_collections.ConfigDict) -> str:
    """The resolved kernels of `m` in one line, with the reason wherever "auto" had to take a stand-in for the
    platform's first choice (the run header, `launch.gpu_check`'s reports)."""
    _, _, why = _auto(m)
    notes = "; ".join(f"{name} auto: {reason}" for name, reason in why.items())
    return f"{resolve(m)} ({notes})" if notes else str(resolve(m))


def resolved_config(m: ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
    """Model config `m` with `kernels` replaced by its resolved, concrete names (a new frozen config): the model
    is built from it, so every module and every later reader (run header, checkpoint metadata) sees them."""
    changed = ml_collections.ConfigDict(m.to_dict() if isinstance(m, ml_collections.FrozenConfigDict) else m)
    changed.kernels = resolve(m).as_dict()
    return ml_collections.FrozenConfigDict(changed)
