"""The PyTorch reference trainer for throughput comparisons: transformers `ZayaForCausalLM` with
`torch.optim.AdamW`, built from a zaya_jax model's weights (`zaya_jax.hf` mapping), so both sides start
from identical parameters and see identical batches.

torch and transformers are optional: `available()` says whether they import; torch is imported only when a
benchmark asks for the reference.
"""

from __future__ import annotations

import time
from typing import Any

import ml_collections
import numpy as np

from zaya_jax.hf.config import config_to_hf
from zaya_jax.hf.mapping import state_to_hf, tensor_specs


def available() -> tuple[bool, str]:
    """(True, versions) when torch and transformers with `ZayaForCausalLM` import, else (False, why)."""
    try:
        import torch  # optional (the reference stack): checked here, not at import
        import transformers

        getattr(transformers, "ZayaForCausalLM")
    except (ImportError, AttributeError) as err:  # pragma: no cover - depends on the environment
        return False, f"{type(err).__name__}: {err}"
    return True, f"torch {torch.__version__}, transformers {transformers.__version__}"


def hf_state_dict(m: ml_collections.ConfigDict, arrays: dict[tuple, np.ndarray]) -> dict[str, np.ndarray]:
    """HF-native tensors (name → array) for a model config and its flat JAX state (path → array)."""
    return state_to_hf(tensor_specs(m, {p: a.shape for p, a in arrays.items()}, "hf"), arrays)


class TorchTrainer:
    """`ZayaForCausalLM` + AdamW on CPU. `step(ids [B, S] int)` runs forward (`labels=ids`, so the loss is
    the mean next-token CE over B·(S−1) tokens), backward and the optimizer step; returns the loss."""

    def __init__(
        self,
        m: ml_collections.ConfigDict,
        arrays: dict[tuple, np.ndarray],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        threads: int | None = None,
        autocast: bool = False,
    ):
        import torch  # optional (the reference stack): only the torch comparison imports it
        import transformers

        if threads:
            torch.set_num_threads(int(threads))
        self.torch = torch
        self.autocast = bool(autocast)  # bf16 mixed precision: torch.autocast on CPU, fp32 master weights
        torch.manual_seed(0)
        config = transformers.ZayaConfig(**config_to_hf(m))
        self.model = transformers.ZayaForCausalLM(config).float()
        tensors = {k: torch.from_numpy(np.array(v, np.float32, copy=True)) for k, v in hf_state_dict(m, arrays).items()}
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
        if missing or unexpected:
            raise ValueError(f"HF state mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.attn_implementation = getattr(self.model.config, "_attn_implementation", "?")
        self.threads = torch.get_num_threads()

    def step(self, ids: np.ndarray) -> float:
        torch = self.torch
        x = torch.from_numpy(np.asarray(ids, np.int64))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.model(input_ids=x, labels=x).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def timed_step(self, ids: np.ndarray) -> tuple[float, float]:
        """(loss, wall seconds) of one full training step."""
        t0 = time.perf_counter()
        loss = self.step(ids)
        return loss, time.perf_counter() - t0


def describe(trainer: Any) -> str:
    amp = ", torch.autocast(cpu, bfloat16)" if trainer.autocast else ""
    return f"torch threads={trainer.threads}, attention={trainer.attn_implementation}{amp}"
