"""Tensor-name and layout mapping between zaya_jax state paths and PyTorch checkpoints (spec §11).

Two PyTorch layouts are supported:
* ``"hf"``: HF-native, 40 decoder layers `model.layers.{i}.…` (transformers `ZayaForCausalLM`).
* ``"legacy"``: Zyphra's fork, 80 half-layers `model.layers.{n}.…` (even n attention, odd n MoE), one
  tensor per expert, the post-MoE merge of layer i stored in half-layer 2i+2 (`model.res_scale` for the last).

JAX paths are tuples such as `("layers", "attn", "wq")`; per-layer tensors carry a leading [L] axis (and
the expert tensors [L, E, …]). PyTorch kernels are `[out, in]`, JAX kernels `[in, out]`. Pure NumPy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

import ml_collections
import numpy as np

from zaya_jax.hf.config import HFConversionError

Path = tuple[str, ...]
LAYOUTS = ("hf", "legacy")
TIED_HEAD = "lm_head.weight"


@dataclasses.dataclass(frozen=True)
class Transform:
    """One JAX ↔ PyTorch tensor transform; `hf_shape` maps a JAX slice shape to the PyTorch shape."""

    to_jax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


def _swap(w: np.ndarray) -> np.ndarray:
    return np.swapaxes(w, -1, -2)


def _conv2_to_jax(w: np.ndarray) -> np.ndarray:
    """torch [G·d, d_in, k] → JAX [k, G, d_in, d_out], w[τ,g,i,o] = W[d·g+o, i, τ] (§11)."""
    c, d, k = w.shape
    return w.reshape(c // d, d, d, k).transpose(3, 0, 2, 1)


def _conv2_to_hf(w: np.ndarray) -> np.ndarray:
    k, g, d, _ = w.shape
    return w.transpose(1, 3, 2, 0).reshape(g * d, d, k)


IDENTITY = Transform(lambda w: w, lambda w: w, lambda s: tuple(s))
TRANSPOSE = Transform(_swap, _swap, lambda s: (*s[:-2], s[-1], s[-2]))
CONV1 = Transform(lambda w: w[:, 0, :].T, lambda w: w.T[:, None, :], lambda s: (s[1], 1, s[0]))  # [C,1,k]↔[k,C]
CONV2 = Transform(_conv2_to_jax, _conv2_to_hf, lambda s: (s[1] * s[2], s[2], s[0]))

_MERGE = (
    ("h_scale", "hidden_states_scale"),
    ("h_bias", "hidden_states_bias"),
    ("r_scale", "residual_scale"),
    ("r_bias", "residual_bias"),
)

# (JAX path under "layers", HF-native suffix, legacy half-layer offset from 2i, legacy suffix, transform)
_LAYER_TABLE: tuple[tuple[Path, str, int, str, Transform], ...] = (
    (("attn_norm", "scale"), "input_layernorm.weight", 0, "input_norm.weight", IDENTITY),
    (("attn", "wq"), "self_attn.qkv_proj.q_proj.weight", 0, "self_attn.qkv.linear_q.weight", TRANSPOSE),
    (("attn", "wk"), "self_attn.qkv_proj.k_proj.weight", 0, "self_attn.qkv.linear_k.weight", TRANSPOSE),
    (("attn", "wv_cur"), "self_attn.qkv_proj.v_proj_current.weight", 0, "self_attn.qkv.val_proj1.weight", TRANSPOSE),
    (("attn", "wv_del"), "self_attn.qkv_proj.v_proj_delayed.weight", 0, "self_attn.qkv.val_proj2.weight", TRANSPOSE),
    (("attn", "conv1_w"), "self_attn.qkv_proj.conv_qk_depthwise.weight", 0, "self_attn.qkv.conv_qk.0.weight", CONV1),
    (("attn", "conv1_b"), "self_attn.qkv_proj.conv_qk_depthwise.bias", 0, "self_attn.qkv.conv_qk.0.bias", IDENTITY),
    (("attn", "conv2_w"), "self_attn.qkv_proj.conv_qk_grouped.weight", 0, "self_attn.qkv.conv_qk.1.weight", CONV2),
    (("attn", "conv2_b"), "self_attn.qkv_proj.conv_qk_grouped.bias", 0, "self_attn.qkv.conv_qk.1.bias", IDENTITY),
    (("attn", "temp"), "self_attn.qk_norm.temp", 0, "self_attn.qkv.temp", IDENTITY),
    (("attn", "wo"), "self_attn.o_proj.weight", 0, "self_attn.o_proj.weight", TRANSPOSE),
    *((("attn_merge", j), f"post_attention_residual_scale.{h}", 1, f"res_scale.{h}", IDENTITY) for j, h in _MERGE),
    (("moe_norm", "scale"), "post_attention_layernorm.weight", 1, "input_norm.weight", IDENTITY),
    (("moe", "router", "w_down"), "mlp.gate.down_proj.weight", 1, "zaya_block.router.down_proj.weight", TRANSPOSE),
    (("moe", "router", "b_down"), "mlp.gate.down_proj.bias", 1, "zaya_block.router.down_proj.bias", IDENTITY),
    (
        ("moe", "router", "eda_scale"),
        "mlp.gate.router_states_scale",
        1,
        "zaya_block.router.router_states_scale",
        IDENTITY,
    ),
    (("moe", "router", "norm"), "mlp.gate.router_mlp.norm.weight", 1, "zaya_block.router.rmsnorm_eda.weight", IDENTITY),
    (("moe", "router", "w1"), "mlp.gate.router_mlp.fc1.weight", 1, "zaya_block.router.router_mlp.0.weight", TRANSPOSE),
    (("moe", "router", "b1"), "mlp.gate.router_mlp.fc1.bias", 1, "zaya_block.router.router_mlp.0.bias", IDENTITY),
    (("moe", "router", "w2"), "mlp.gate.router_mlp.fc2.weight", 1, "zaya_block.router.router_mlp.2.weight", TRANSPOSE),
    (("moe", "router", "b2"), "mlp.gate.router_mlp.fc2.bias", 1, "zaya_block.router.router_mlp.2.bias", IDENTITY),
    (
        ("moe", "router", "w3"),
        "mlp.gate.router_mlp.out_proj.weight",
        1,
        "zaya_block.router.router_mlp.4.weight",
        TRANSPOSE,
    ),
    (
        ("moe", "router", "balancing_bias"),
        "mlp.gate.balancing_biases",
        1,
        "zaya_block.router.balancing_biases",
        IDENTITY,
    ),
    (
        ("moe", "w_in"),
        "mlp.experts.gate_up_proj",
        1,
        "zaya_block.experts.local_experts.{e}.linear_fc1.weight",
        TRANSPOSE,
    ),
    (("moe", "w_out"), "mlp.experts.down_proj", 1, "zaya_block.experts.local_experts.{e}.linear_fc2.weight", TRANSPOSE),
    *((("moe_merge", j), f"post_mlp_residual_scale.{h}", 2, f"res_scale.{h}", IDENTITY) for j, h in _MERGE),
)

# (JAX path, HF-native name, legacy name)
_GLOBAL_TABLE: tuple[tuple[Path, str, str], ...] = (
    (("embed",), "model.embed_tokens.weight", "model.embed_tokens.weight"),
    (("in_bias",), "model.input_hidden_states_bias", "model.layers.0.res_scale.hidden_states_bias"),
    (("in_scale",), "model.input_hidden_states_scale", "model.layers.0.res_scale.hidden_states_scale"),
    (("final_norm", "scale"), "model.norm.weight", "model.final_norm.weight"),
)
_EDA = ("layers", "moe", "router", "eda_scale")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """PyTorch tensor `name` ↔ `state[path][index]` (index = (), (layer,) or (layer, expert))."""

    name: str
    path: Path
    index: tuple[int, ...]
    transform: Transform
    hf_shape: tuple[int, ...]


def _legacy_name(suffix: str, i: int, offset: int, num_layers: int) -> str:
    if offset == 2 and i == num_layers - 1:
        return f"model.{suffix}"  # the post-MoE merge of the last layer is the final merge
    return f"model.layers.{2 * i + offset}.{suffix}"


def tensor_specs(m: ml_collections.ConfigDict, shapes: Mapping[Path, tuple[int, ...]], layout: str) -> list[TensorSpec]:
    """Every PyTorch tensor of `layout` for a model with state `shapes` (path → full JAX shape)."""
    if layout not in LAYOUTS:
        raise HFConversionError(f"layout={layout!r}; choose one of {LAYOUTS}")
    legacy, num_layers = layout == "legacy", int(m.num_layers)
    specs = [
        TensorSpec(legacy_name if legacy else hf_name, path, (), IDENTITY, tuple(shapes[path]))
        for path, hf_name, legacy_name in _GLOBAL_TABLE
    ]
    for sub, hf_suffix, offset, legacy_suffix, tf in _LAYER_TABLE:
        path = ("layers", *sub)
        per_expert = legacy and "{e}" in legacy_suffix
        for i in range(num_layers):
            if path == _EDA and i == 0:
                continue  # the first router has no EDA scale in either layout (§6)
            experts = range(shapes[path][1]) if per_expert else [None]
            for e in experts:
                index = (i,) if e is None else (i, e)
                name = (
                    _legacy_name(legacy_suffix.format(e=e), i, offset, num_layers)
                    if legacy
                    else f"model.layers.{i}.{hf_suffix}"
                )
                specs.append(TensorSpec(name, path, index, tf, tf.hf_shape(tuple(shapes[path][len(index) :]))))
    return specs


def detect_layout(names: Iterable[str], source: str = "checkpoint") -> str:
    """ "hf" or "legacy" from the tensor names (raises `HFConversionError` if neither matches)."""
    names = set(names)
    if "model.norm.weight" in names or any(".qkv_proj." in n for n in names):
        return "hf"
    if "model.final_norm.weight" in names or any(".zaya_block." in n for n in names):
        return "legacy"
    raise HFConversionError(
        f"{source}: cannot detect the layout (no 'model.norm.weight' (HF-native) or "
        "'model.final_norm.weight' (legacy) tensor); pass layout='hf' or 'legacy'"
    )


def check_names(specs: list[TensorSpec], names: Iterable[str], layout: str, where: Callable[[str], str]) -> None:
    """Raise for an unknown (unexpected) or a missing tensor name; `where(name)` names the file."""
    expected = {s.name for s in specs}
    names = set(names)
    unknown = sorted(names - expected - {TIED_HEAD})
    if unknown:
        raise HFConversionError(
            f"{where(unknown[0])}: unknown tensor {unknown[0]!r} for the {layout!r} layout"
            f" ({len(unknown)} unknown in total)"
        )
    missing = [s.name for s in specs if s.name not in names]
    if missing:
        raise HFConversionError(
            f"checkpoint: missing tensor {missing[0]!r} ({layout!r} layout; {len(missing)} missing in total)"
        )


def hf_to_state(
    specs: list[TensorSpec],
    get: Callable[[str], np.ndarray],
    shapes: Mapping[Path, tuple[int, ...]],
    dtypes: Mapping[Path, np.dtype],
) -> dict[Path, np.ndarray]:
    """Fill one NumPy array per JAX path from PyTorch tensors (`get(name)`), in place, no stacking copies.

    The first router's `eda_scale` (no PyTorch tensor) is filled with ones.
    """
    out = {path: np.empty(shape, dtypes[path]) for path, shape in shapes.items()}
    if _EDA in out:
        out[_EDA][0] = 1.0
    for spec in specs:
        out[spec.path][spec.index] = spec.transform.to_jax(get(spec.name))
    return out


def state_to_hf(specs: list[TensorSpec], state: Mapping[Path, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch tensors (contiguous NumPy arrays) from JAX arrays keyed by path."""
    return {s.name: np.ascontiguousarray(s.transform.to_hf(np.asarray(state[s.path])[s.index])) for s in specs}
