"""zaya_jax: pretraining the ZAYA1 mixture-of-experts model with JAX/XLA (arXiv 2511.17127)."""

__version__ = "0.1.0"
