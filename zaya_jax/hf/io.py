"""Read and write `transformers`-style ZAYA checkpoints (config.json + *.safetensors) without torch.

Weights go through `safetensors` with the NumPy framework (`safe_open(framework="numpy")`, which returns BF16
tensors as `ml_dtypes.bfloat16` arrays from safetensors 0.8 on). Tensor names: `zaya_jax/hf/mapping.py`;
layouts: docs/architecture.md §11.
"""

from __future__ import annotations

import glob
import json
import math
import os
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np
import safetensors.numpy
from flax import nnx
from safetensors import SafetensorError, safe_open

from zaya_jax.config import default_config
from zaya_jax.hf.config import HFConversionError, config_from_hf, config_to_hf
from zaya_jax.hf.mapping import (
    TIED_HEAD,
    Path,
    check_names,
    detect_layout,
    hf_to_state,
    state_to_hf,
    tensor_specs,
)
from zaya_jax.model import Zaya, abstract_model

CONFIG_FILE, SINGLE_FILE, INDEX_FILE = "config.json", "model.safetensors", "model.safetensors.index.json"


def read_hf_config(path: str) -> dict[str, Any]:
    """The parsed `path/config.json` (raises `HFConversionError` naming the file)."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise HFConversionError(
            f"{path} is not a directory; pass a transformers checkpoint directory ({CONFIG_FILE} + *.safetensors)"
        )
    if not os.path.isfile(file):
        raise HFConversionError(f"{path} has no {CONFIG_FILE}: it is not a transformers checkpoint directory")
    try:
        with open(file) as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise HFConversionError(f"{file}: invalid JSON ({err})") from err


class SafetensorsCheckpoint:
    """Lazy read access to the tensors of a single-file or sharded (index.json) checkpoint directory."""

    def __init__(self, path: str):
        index = os.path.join(path, INDEX_FILE)
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f).get("weight_map")
            except (ValueError, AttributeError) as err:
                raise HFConversionError(f"{index}: not a shard index ({err})") from err
            if not isinstance(weight_map, dict):
                raise HFConversionError(f"{index}: no 'weight_map' in the shard index")
            files = sorted({os.path.join(path, v) for v in weight_map.values()})
        else:
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
            if not files:
                raise HFConversionError(f"{path}: no *.safetensors file (and no {INDEX_FILE})")
        self._handles, self.file_of = {}, {}
        for file in files:
            if not os.path.isfile(file):
                raise HFConversionError(f"{file}: shard listed in {INDEX_FILE} is missing")
            handle = self._handles[file] = _unreadable_as_error(file, safe_open, file, framework="numpy")
            for name in handle.keys():
                if name in self.file_of:
                    raise HFConversionError(f"{file}: tensor {name!r} also stored in {self.file_of[name]}")
                self.file_of[name] = file

    def names(self) -> list[str]:
        return list(self.file_of)

    def where(self, name: str) -> str:
        return self.file_of.get(name, "checkpoint")

    def shape(self, name: str) -> tuple[int, ...]:
        file = self.file_of[name]
        return tuple(_unreadable_as_error(file, lambda: self._handles[file].get_slice(name).get_shape()))

    def get(self, name: str) -> np.ndarray:
        file = self.file_of[name]
        return _unreadable_as_error(file, self._handles[file].get_tensor, name)


def _unreadable_as_error(file: str, read, *args, **kwargs):
    """`read(*args, **kwargs)`, with a damaged / truncated safetensors file reported as one HFConversionError."""
    try:
        return read(*args, **kwargs)
    except (SafetensorError, OSError) as err:
        raise HFConversionError(
            f"{file}: not a readable safetensors file ({' '.join(str(err).split())}); re-download or re-export it"
        ) from err


def _read_state(
    ckpt: SafetensorsCheckpoint,
    m: ml_collections.ConfigDict,
    layout: str,
    shapes: dict[Path, tuple[int, ...]],
    dtypes: dict[Path, np.dtype],
) -> dict[Path, np.ndarray]:
    """Validate names and shapes against the expected layout, then read every tensor."""
    if layout == "auto":
        layout = detect_layout(ckpt.names(), source=str(sorted(set(ckpt.file_of.values()))))
    specs = tensor_specs(m, shapes, layout)
    check_names(specs, ckpt.names(), layout, ckpt.where)
    for spec in specs:
        found = ckpt.shape(spec.name)
        if found != spec.hf_shape:
            raise HFConversionError(
                f"{ckpt.where(spec.name)}: tensor {spec.name!r} has shape {list(found)}, "
                f"expected {list(spec.hf_shape)} from config.json"
            )
    state = hf_to_state(specs, ckpt.get, shapes, dtypes)
    if TIED_HEAD in ckpt.file_of and not np.array_equal(
        np.asarray(ckpt.get(TIED_HEAD), np.float32), np.asarray(state[("embed",)], np.float32)
    ):
        raise HFConversionError(
            f"{ckpt.where(TIED_HEAD)}: tensor {TIED_HEAD!r} differs from the embedding; "
            "an untied LM head is unsupported"
        )
    return state


def load_pretrained(
    path: str,
    *,
    dtype: str | None = None,
    skip_output: str = "zero",
    layout: str = "auto",
    overrides: dict[str, Any] | None = None,
) -> tuple[ml_collections.ConfigDict, Zaya]:
    """Load a `transformers` `save_pretrained` directory (HF-native or legacy names) into a JAX `Zaya`.

    dtype: parameter and compute dtype ("float32" | "bfloat16"); None keeps the project default (fp32).
    Balancing biases stay fp32. The model is built from `abstract_model` and filled, so no random model is
    allocated. Returns (`default_config()` with its `model` section from config.json, model).
    """
    overrides = dict(overrides or {})
    if dtype is not None:
        overrides.update(param_dtype=str(dtype), dtype=str(dtype))
    m = config_from_hf(
        read_hf_config(path), skip_output=skip_output, overrides=overrides, source=os.path.join(path, CONFIG_FILE)
    )
    graphdef, abstract_state = nnx.split(abstract_model(m))
    flat = nnx.to_flat_state(abstract_state)
    shapes = {p: tuple(v.get_value().shape) for p, v in flat}
    dtypes = {p: np.dtype(v.get_value().dtype) for p, v in flat}
    state = _read_state(SafetensorsCheckpoint(path), m, layout, shapes, dtypes)
    for p, v in flat:
        v.set_value(jnp.asarray(state.pop(p)))
    config = default_config()
    config.model = m
    return config, nnx.merge(graphdef, nnx.from_flat_state(flat))


def model_arrays(model: Zaya) -> dict[Path, np.ndarray]:
    """Every state variable of `model` (params and balancing biases) as NumPy, keyed by path tuple."""
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> list[dict[str, np.ndarray]]:
    if not max_shard_bytes:
        return [tensors]
    shards, size = [{}], 0
    for name, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards, size = shards + [{}], 0
        shards[-1][name], size = arr, size + arr.nbytes
    return shards


def save_pretrained(
    model: Zaya, path: str, *, layout: str = "hf", overwrite: bool = False, max_shard_bytes: int | None = None
) -> None:
    """Write config.json + model.safetensors (or index-linked shards) that `ZayaForCausalLM.from_pretrained`
    loads (layout "hf"); layout "legacy" writes the 80-half-layer names (same config.json).

    Tensors keep the parameter dtype; the tied LM head is not written. Refuses a non-empty directory
    unless `overwrite=True` (then stale *.safetensors / index files there are removed first).
    """
    if os.path.isdir(path) and os.listdir(path):
        if not overwrite:
            raise HFConversionError(f"{path}: directory exists and is not empty; pass overwrite=True")
        for stale in glob.glob(os.path.join(path, "*.safetensors")) + glob.glob(os.path.join(path, INDEX_FILE)):
            os.remove(stale)
    os.makedirs(path, exist_ok=True)
    arrays = model_arrays(model)
    tensors = state_to_hf(tensor_specs(model.cfg, {p: a.shape for p, a in arrays.items()}, layout), arrays)
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        safetensors.numpy.save_file(shards[0], os.path.join(path, SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            safetensors.numpy.save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(math.prod(a.shape) * a.dtype.itemsize for a in tensors.values())
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(config_to_hf(model.cfg), f, indent=2, sort_keys=True)
