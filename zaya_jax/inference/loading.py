"""Model and tokenizer loading for the inference launchers (`launch.generate`, `launch.eval`)."""

from __future__ import annotations

import importlib
import os

import ml_collections

from zaya_jax import hf as hf_io
from zaya_jax.data.tokenizer import Tokenizer, load_tokenizer
from zaya_jax.errors import ZayaError
from zaya_jax.model.zaya import Zaya


class LoadError(ZayaError, RuntimeError):
    """The model cannot be loaded; the message says why and what to pass instead."""


def load_model(
    hf: str | None = None, checkpoint: str | None = None, *, dtype: str | None = None, skip_output: str = "zero"
) -> tuple[ml_collections.ConfigDict, Zaya]:
    """(config, model) from a `transformers` directory (`zaya_jax.hf.load_pretrained`) or a training
    checkpoint (`zaya_jax.checkpoint.load_model`). Exactly one of `hf` / `checkpoint`.

    dtype / skip_output apply to HF directories (a checkpoint carries its own config).
    """
    if (hf is None) == (checkpoint is None):
        raise LoadError("pass exactly one of --hf=DIR or --checkpoint=DIR")
    if hf is not None:
        return hf_io.load_pretrained(os.path.expanduser(hf), dtype=dtype, skip_output=skip_output)
    try:
        module = importlib.import_module("zaya_jax.checkpoint")
    except ImportError as err:
        raise LoadError(f"checkpoint loading is not available ({err}); use --hf=DIR") from err
    loader = getattr(module, "load_model", None)
    if loader is None:
        raise LoadError(
            "checkpoint loading is not available: zaya_jax.checkpoint has no load_model(path) yet; "
            "use --hf=DIR (a transformers directory) instead"
        )
    return loader(os.path.expanduser(checkpoint))


def default_tokenizer(spec: str | None, hf: str | None = None) -> Tokenizer:
    """`spec` ("byte" or a tokenizer.json path / directory) if given; else the --hf directory's
    tokenizer.json if there is one; else the byte tokenizer."""
    if spec:
        return load_tokenizer(spec)
    if hf and os.path.isfile(os.path.join(os.path.expanduser(hf), "tokenizer.json")):
        return load_tokenizer(os.path.join(os.path.expanduser(hf), "tokenizer.json"))
    return load_tokenizer("byte")
