"""A hidden-1024 ZAYA1 (4 layers, 8 experts of width 1024) for the MFU benchmark on CPU
(`python -m benchmarks.peers --config=experiments/zaya1_h1024.py --reference=false`); the `h1024`
variant of experiments/zaya1.py."""

import os

from zaya_jax.config import config_module


def get_config(arg=None):
    zaya1 = config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))
    return zaya1.get_config(",".join(filter(None, ("h1024", arg))))
