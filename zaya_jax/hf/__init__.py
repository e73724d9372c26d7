"""Hugging Face ↔ zaya_jax conversion: configs, the HF-native / legacy weight layouts (spec §11),
loading `transformers` checkpoints into the JAX model and exporting JAX models as HF checkpoints.

    config, model = load_pretrained("/path/to/hf_dir")          # logits parity with HF-native ("zero" skip)
    save_pretrained(model, "/path/to/out")                      # ZayaForCausalLM.from_pretrained loads it

No torch import: weights go through `safetensors` with NumPy.
"""

from zaya_jax.hf.config import HFConversionError, config_from_hf, config_to_hf
from zaya_jax.hf.io import SafetensorsCheckpoint, load_pretrained, model_arrays, read_hf_config, save_pretrained
from zaya_jax.hf.mapping import LAYOUTS, TensorSpec, detect_layout, hf_to_state, state_to_hf, tensor_specs

__all__ = [
    "HFConversionError",
    "LAYOUTS",
    "SafetensorsCheckpoint",
    "TensorSpec",
    "config_from_hf",
    "config_to_hf",
    "detect_layout",
    "hf_to_state",
    "load_pretrained",
    "model_arrays",
    "read_hf_config",
    "save_pretrained",
    "state_to_hf",
    "tensor_specs",
]
