"""The ZAYA1 network in Flax NNX: CCA attention, ZAYA1 router, top-1 MoE, residual scaling."""

from zaya_jax.model.zaya import Zaya, abstract_model, init_model

__all__ = ["Zaya", "abstract_model", "init_model"]
