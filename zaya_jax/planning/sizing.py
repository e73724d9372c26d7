"""The paper's MI300X-aware sizing rules (arXiv 2511.17127; docs/sizing.md), for the accelerators of
`zaya_jax.hardware`.

Rules (the paper reports MI300X-aware sizing but not its thresholds; these are the project's, see docs/sizing.md):
  1. GEMM dims (hidden, head, intermediate, router, derived q/k/v widths) are multiples of 64,
     preferably 128 (`strict=True` also flags 64-but-not-128).
  2. vocab_size is padded to a multiple of 64 (128 preferred; proposals pad up to 128).
  3. head_dim is a multiple of 64; 128 is preferred.
  4. tokens per GEMM (per device, per microbatch) a multiple of 128 (when given).
  5. expert GEMMs must be able to reach the roofline ridge: their arithmetic-intensity ceiling
     H·N/(H+N) must exceed peak/bandwidth; with `tokens_per_device`, the routed tokens per expert
     T_e must reach the ridge too.
  6. dims sharded over a mesh axis divide by the axis size (when a mesh is given).

`check_model(cfg) -> list[str]` returns human-readable violations (field, value, rule, nearest
compliant values); `propose(cfg) -> {field: value}` the nearest compliant sizes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from zaya_jax.hardware import Hardware, get_hardware

BYTES_BF16 = 2
DIM_MULTIPLE = 64  # hard rule
DIM_PREFERRED = 128  # preferred multiple / head_dim
TOKEN_MULTIPLE = 128


SIZING_MIN_HIDDEN = 512  # smaller models are CPU / debugging sizes: not meant to be sized for MI300X


def warn_model(model_cfg: Any, hardware: str | Hardware = "mi300x") -> list[str]:
    """`warnings.warn` each sizing violation of a model of hidden size >= SIZING_MIN_HIDDEN ("sizing: ...";
    the launcher `launch.train` calls it before training starts; `launch.check_sizing` gives details for models of
    any size)."""
    m, _ = _model_section(model_cfg)
    found = check_model(m, hardware) if int(m.hidden_size) >= SIZING_MIN_HIDDEN else []
    for violation in found:
        warnings.warn(f"sizing: {violation}", stacklevel=2)
    return found


def _down(x: int, m: int) -> int:
    return (x // m) * m


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def _nearest(x: int, m: int) -> int:
    """Nearest positive multiple of m (ties round up)."""
    lo, hi = _down(x, m), _up(x, m)
    return hi if lo == 0 or x - lo >= hi - x else lo


def _neighbours(x: int, m: int) -> str:
    lo, hi = _down(x, m), _up(x, m)
    return f"{hi}" if lo == 0 else f"{lo} or {hi}"


def _model_section(cfg: Any) -> tuple[Any, Any]:
    """(model sub-config, full config or None): accepts a model ConfigDict or a full config."""
    if "model" in cfg:
        return cfg.model, cfg
    return cfg, None


def expert_intensity(tokens_per_expert: float, d_in: int, d_out: int, bytes_per_el: int = BYTES_BF16) -> float:
    """FLOP/byte of `[T_e, d_in] x [d_in, d_out]` reading both operands and writing the output once."""
    t = tokens_per_expert
    return 2 * t * d_in * d_out / (bytes_per_el * (t * d_in + d_in * d_out + t * d_out))


def min_tokens_for_ridge(d_in: int, d_out: int, ridge: float, bytes_per_el: int = BYTES_BF16) -> float:
    """Smallest T_e with `expert_intensity >= ridge` (inf when the GEMM can never reach it)."""
    r = ridge * bytes_per_el / 2  # FLOP per element-byte-unit
    denom = d_in * d_out - r * (d_in + d_out)
    return math.inf if denom <= 0 else r * d_in * d_out / denom


def _findings(
    cfg: Any, hardware: str | Hardware, tokens_per_device: int | None, mesh: Mapping[str, int] | None, strict: bool
) -> list[tuple[str, str, int | None]]:
    """(message, field, proposed value or None) for every violated rule."""
    m, full = _model_section(cfg)
    hw = get_hardware(hardware)
    if mesh is None and full is not None and "mesh" in full:
        mesh = {k: int(v) for k, v in full.mesh.items() if isinstance(v, int) and int(v) > 1}
    out: list[tuple[str, str, int | None]] = []
    ref = "docs/sizing.md"

    def dim_rule(field: str, rule_no: str, *, up: bool = False) -> None:
        v = int(m[field])
        need = DIM_PREFERRED if strict else DIM_MULTIPLE
        if v % need == 0:
            return
        prop = _up(v, DIM_PREFERRED) if up else _nearest(v, DIM_PREFERRED)
        if v % DIM_MULTIPLE:
            what = "padded to a multiple of 64 (128 preferred)" if up else "a multiple of 64 (128 preferred)"
        else:
            what = "a multiple of 128 (strict mode)"
        out.append(
            (
                f"model.{field}={v}: not {what} on {hw.name} ({ref} rule {rule_no}); nearest compliant: "
                f"{_neighbours(v, DIM_MULTIPLE)} (multiples of 64), {_neighbours(v, DIM_PREFERRED)} "
                f"(multiples of 128); proposed: {prop}",
                field,
                prop,
            )
        )

    dim_rule("hidden_size", "1")
    dim_rule("head_dim", "1, 3")
    dim_rule("moe_intermediate_size", "1")
    dim_rule("router_hidden_size", "1")
    dim_rule("vocab_size", "2", up=True)

    # derived projection widths (follow from head_dim / head counts; no single-field proposal)
    hd, nq, nkv = int(m.head_dim), int(m.num_q_heads), int(m.num_kv_heads)
    for name, width, fields in (
        ("q projection width num_q_heads*head_dim", nq * hd, "num_q_heads, head_dim"),
        ("k projection width num_kv_heads*head_dim", nkv * hd, "num_kv_heads, head_dim"),
        ("CCA value half-width num_kv_heads*head_dim/2", nkv * hd // 2, "num_kv_heads, head_dim"),
    ):
        if width % DIM_MULTIPLE and hd % DIM_MULTIPLE == 0:
            out.append(
                (
                    f"model.{name}={width}: not a multiple of 64 ({ref} rule 1); nearest compliant: "
                    f"{_neighbours(width, DIM_MULTIPLE)}; change {fields}",
                    fields.split(",")[0],
                    None,
                )
            )

    # rule 5a: expert GEMMs must be able to reach the roofline ridge at all. For T_e -> inf the bf16
    # intensity of [T_e,a]x[a,b] tends to a*b/(a+b); gate/up is (h, 2*inter), down is (inter, h).
    h, inter, e = int(m.hidden_size), int(m.moe_intermediate_size), int(m.num_experts)
    ceiling = min(h * 2 * inter / (h + 2 * inter), inter * h / (inter + h))
    if ceiling < hw.ridge:
        if h > hw.ridge:
            need = _up(math.ceil(hw.ridge * h / (h - hw.ridge)), DIM_PREFERRED)
            fix = f"nearest compliant: moe_intermediate_size >= {need}; proposed: {need}"
        else:
            need = None
            fix = f"hidden_size={h} is itself below the ridge: widen the model"
        out.append(
            (
                f"model.moe_intermediate_size={inter} (hidden_size={h}): the expert GEMMs can reach at most "
                f"{ceiling:.0f} FLOP/B < {hw.name} ridge {hw.ridge:.0f} FLOP/B at any token count, so they "
                f"stay memory-bound ({ref} rule 5); {fix}",
                "moe_intermediate_size",
                need,
            )
        )

    topk = int(m.num_experts_per_tok)
    if tokens_per_device is not None:
        t = int(tokens_per_device)
        if t % TOKEN_MULTIPLE:
            out.append(
                (
                    f"tokens_per_device={t}: tokens per GEMM (batch*seq per device per microbatch) not a "
                    f"multiple of {TOKEN_MULTIPLE} ({ref} rule 4); nearest compliant: "
                    f"{_neighbours(t, TOKEN_MULTIPLE)}",
                    "tokens_per_device",
                    _up(t, TOKEN_MULTIPLE),
                )
            )
        te = t * topk / e
        need_te = min_tokens_for_ridge(h, 2 * inter, hw.ridge)
        if math.isfinite(need_te) and te < need_te:
            need_t = _up(math.ceil(need_te * e / topk), TOKEN_MULTIPLE)
            out.append(
                (
                    f"tokens_per_device={t}: {te:.0f} routed tokens per expert (top-{topk} of {e}) give "
                    f"expert gate/up intensity {expert_intensity(te, h, 2 * inter):.0f} FLOP/B < {hw.name} "
                    f"ridge {hw.ridge:.0f} ({ref} rule 5); need T_e >= {math.ceil(need_te)}, i.e. >= "
                    f"{need_t} tokens per device per expert GEMM call",
                    "tokens_per_device",
                    need_t,
                )
            )

    # rule 6: sharded dims divide by their mesh axis
    for field, axis in SHARDED_DIMS.items():
        size = int((mesh or {}).get(axis, 1) or 1)
        if size > 1 and int(m[field]) % size:
            v = int(m[field])
            out.append(
                (
                    f"model.{field}={v}: sharded over mesh axis '{axis}' of size {size} but not divisible "
                    f"({ref} rule 6); nearest compliant: {_neighbours(v, size)}",
                    field,
                    _up(v, size),
                )
            )
    return out


# which model dims are sharded over which mesh axis (rule 6; experts over 'expert' under EP)
SHARDED_DIMS: dict[str, str] = {"num_experts": "expert"}


def check_model(
    model_cfg: Any,
    hardware: str | Hardware = "mi300x",
    *,
    tokens_per_device: int | None = None,
    mesh: Mapping[str, int] | None = None,
    strict: bool = False,
) -> list[str]:
    """Human-readable sizing violations of `model_cfg` (a model ConfigDict or a full config).

    `tokens_per_device`: tokens per device per microbatch (enables rules 4 and 5b);
    `mesh`: axis sizes, e.g. {'data': 8, 'expert': 2} (rule 6); `strict`: require multiples of 128.
    """
    return [msg for msg, _f, _p in _findings(model_cfg, hardware, tokens_per_device, mesh, strict)]


def propose(
    model_cfg: Any,
    hardware: str | Hardware = "mi300x",
    *,
    tokens_per_device: int | None = None,
    mesh: Mapping[str, int] | None = None,
    strict: bool = False,
) -> dict[str, int]:
    """Nearest compliant value per violating field (e.g. head_dim 96 -> 128, vocab 50257 -> 50304)."""
    out: dict[str, int] = {}
    for _msg, field, prop in _findings(model_cfg, hardware, tokens_per_device, mesh, strict):
        if prop is not None:
            out[field] = max(out.get(field, prop), prop)
    return out


def ridge_requirement(model_cfg: Any, hardware: str | Hardware = "mi300x") -> str:
    """One line: the tokens per expert / per device at which the expert gate/up GEMM hits the ridge."""
    m, _ = _model_section(model_cfg)
    hw = get_hardware(hardware)
    h, inter, e = int(m.hidden_size), int(m.moe_intermediate_size), int(m.num_experts)
    topk = int(m.num_experts_per_tok)
    te = min_tokens_for_ridge(h, 2 * inter, hw.ridge)
    if not math.isfinite(te):
        return f"expert gate/up GEMM [T_e,{h}]x[{h},{2 * inter}] never reaches the {hw.name} ridge"
    return (
        f"expert gate/up GEMM [T_e,{h}]x[{h},{2 * inter}] reaches the {hw.name} ridge ({hw.ridge:.0f} FLOP/B) "
        f"at T_e >= {math.ceil(te)} tokens per expert, i.e. >= {math.ceil(te * e / topk)} tokens per device "
        f"per expert GEMM call (top-{topk} of {e} experts; {_up(math.ceil(te * e / topk), TOKEN_MULTIPLE)} "
        f"as a multiple of {TOKEN_MULTIPLE})"
    )
