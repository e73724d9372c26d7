"""A ~114M-parameter ZAYA1 for CPU benchmarks (the config of the transformers comparison, benchmarks/README.md):
hidden 512, 8 layers, 4 q / 2 kv heads of 128, 16 experts of width 512, router 128, vocab 8192; the `100m`
variant of experiments/zaya1.py."""

import os

from zaya_jax.config import config_module


def get_config(arg=None):
    zaya1 = config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))
    return zaya1.get_config(",".join(filter(None, ("100m", arg))))
