"""Hugging Face `ZayaConfig` (config.json) ↔ zaya_jax model config (`zaya_jax.config.model_config`).

HF-native field names (transformers 5.24 `ZayaConfig`) differ from the project's: `num_hidden_layers` →
`num_layers`, `num_attention_heads` → `num_q_heads`, `num_key_value_heads` → `num_kv_heads`, and the rotary
settings live in `rope_parameters` (per layer type, `{"hybrid": {rope_theta, partial_rotary_factor,
rope_type}}`, or flat). Spec: docs/architecture.md §1, §11, §12.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from zaya_jax.config import ConfigError, model_config, validate_model
from zaya_jax.errors import ZayaError


class HFConversionError(ZayaError, ValueError):
    """A Hugging Face checkpoint or config cannot be converted; the message names the file, tensor or field."""


# HF-native field -> project field; all are required (no silent defaults for the geometry).
_REQUIRED = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_q_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "moe_intermediate_size": "moe_intermediate_size",
    "num_experts": "num_experts",
    "router_hidden_size": "router_hidden_size",
}
# Optional fields, defaulted exactly as `transformers.ZayaConfig` defaults them.
_OPTIONAL = {
    "cca_time0": ("cca_time0", 2),
    "cca_time1": ("cca_time1", 2),
    "rms_norm_eps": ("rms_norm_eps", 1e-5),
    "max_position_embeddings": ("max_position_embeddings", 131_072),
    "initializer_range": ("initializer_range", 0.02),
    "pad_token_id": ("pad_token_id", 0),
    "bos_token_id": ("bos_token_id", 2),
    "eos_token_id": ("eos_token_id", 106),
}


def _fail(field: str, msg: str, source: str) -> HFConversionError:
    return HFConversionError(f"{source}: field {field!r}: {msg}")


def _rope_settings(hf: Mapping[str, Any], source: str) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from nested `rope_parameters["hybrid"]`, a flat
    `rope_parameters`, or top-level `rope_theta` / `partial_rotary_factor` keys (older configs)."""
    rp = hf.get("rope_parameters")
    if isinstance(rp, Mapping) and ("hybrid" in rp or "hybrid_sliding" in rp):
        if not isinstance(rp.get("hybrid"), Mapping):
            raise _fail("rope_parameters", "nested form needs a 'hybrid' entry (the only supported layer type)", source)
        rp, default_factor = rp["hybrid"], 1.0  # HF reads the nested factor with default 1.0
    elif isinstance(rp, Mapping):
        default_factor = hf.get("partial_rotary_factor", 1.0)
    elif rp is None:
        rp, default_factor = hf, 1.0
    else:
        raise _fail("rope_parameters", f"expected a dict, got {type(rp).__name__}", source)
    rope_type = rp.get("rope_type", "default")
    if rope_type != "default":
        raise _fail("rope_parameters.rope_type", f"{rope_type!r} is not supported (only 'default' RoPE)", source)
    if rp.get("rope_theta") is None:
        raise _fail("rope_parameters.rope_theta", "missing; the rotary base must be given explicitly", source)
    return float(rp["rope_theta"]), float(rp.get("partial_rotary_factor", default_factor))


def _check_supported(hf: Mapping[str, Any], num_layers: int, source: str) -> None:
    """Reject HF options the JAX model does not implement, one field per error."""
    if hf.get("model_type", "zaya") != "zaya":
        raise _fail("model_type", f"{hf['model_type']!r} is not a ZAYA config (expected 'zaya')", source)
    if hf.get("num_experts_per_tok", 1) != 1:
        raise _fail(
            "num_experts_per_tok", f"{hf['num_experts_per_tok']} unsupported: the ZAYA1 router is top-1", source
        )
    if not hf.get("tie_word_embeddings", True):
        raise _fail("tie_word_embeddings", "false is unsupported: ZAYA1 ties the LM head to the embedding", source)
    if hf.get("hidden_act", "silu") != "silu":
        raise _fail("hidden_act", f"{hf['hidden_act']!r} unsupported (experts are SwiGLU: 'silu')", source)
    for flag in ("attention_bias", "lm_head_bias"):
        if hf.get(flag, False):
            raise _fail(flag, "true is unsupported (ZAYA1 has no q/k/v/o or head biases)", source)
    layer_types = hf.get("layer_types")
    if layer_types is not None:
        bad = sorted({t for t in layer_types if t != "hybrid"})
        if bad:
            raise _fail(
                "layer_types", f"{bad} unsupported: only full-causal 'hybrid' layers (no sliding window)", source
            )
        if len(layer_types) != num_layers:
            raise _fail("layer_types", f"has {len(layer_types)} entries for num_hidden_layers={num_layers}", source)


def config_from_hf(
    hf: Mapping[str, Any],
    *,
    skip_output: str = "zero",
    overrides: Mapping[str, Any] | None = None,
    source: str = "config.json",
) -> ml_collections.ConfigDict:
    """Model config section from an HF `ZayaConfig` dict (the content of config.json).

    `skip_output` defaults to "zero" (HF-native semantics, §7); `dispatch` is set to "dropless"
    so a loaded model reproduces the reference exactly; `qk_norm_eps` keeps the project default 2⁻⁷ (the
    floor HF applies in bf16; HF in fp32 uses float32 eps — they differ only for ‖q‖ or ‖k‖ < 2⁻⁷, §9).
    `overrides` (project field names) are applied last. Raises `HFConversionError` naming the field.
    """
    for field in _REQUIRED:
        if hf.get(field) is None:
            raise _fail(field, "missing (required)", source)
    m = model_config()
    for hf_name, name in _REQUIRED.items():
        m[name] = int(hf[hf_name])
    for hf_name, (name, default) in _OPTIONAL.items():
        value = hf.get(hf_name, default)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):  # eos_token_id may be a list; the project keeps one id
            value = value[0]
        m[name] = type(m[name])(value)
    _check_supported(hf, m.num_layers, source)
    m.rope_theta, m.partial_rotary_factor = _rope_settings(hf, source)
    m.skip_output = skip_output
    m.dispatch = "dropless"
    for name, value in (overrides or {}).items():
        if name not in m:
            raise _fail(name, "unknown model config field in overrides", "overrides")
        m[name] = value
    try:
        validate_model(m)
    except ConfigError as err:
        raise HFConversionError(f"{source}: {err}") from err
    return m


def config_to_hf(m: ml_collections.ConfigDict) -> dict[str, Any]:
    """A config.json dict that `transformers.ZayaConfig` accepts (HF-native layout, `model_type: "zaya"`).

    Project-only fields (skip_output, qk_norm_eps, dispatch, remat, temp_init, ...) have no HF equivalent.
    """
    hf: dict[str, Any] = {hf_name: int(m[name]) for hf_name, name in _REQUIRED.items()}
    hf.update({hf_name: m[name] for hf_name, (name, _) in _OPTIONAL.items()})
    hf.update(
        model_type="zaya",
        architectures=["ZayaForCausalLM"],
        num_experts_per_tok=int(m.num_experts_per_tok),
        tie_word_embeddings=True,
        hidden_act="silu",
        attention_bias=False,
        lm_head_bias=False,
        attention_dropout=0.0,
        sliding_window=None,
        layer_types=["hybrid"] * int(m.num_layers),
        rope_parameters={
            "hybrid": {
                "rope_type": "default",
                "rope_theta": float(m.rope_theta),
                "partial_rotary_factor": float(m.partial_rotary_factor),
            }
        },
        use_cache=True,
        output_router_logits=False,
        dtype=str(m.param_dtype),
    )
    return hf
