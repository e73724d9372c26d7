"""A CPU-sized ZAYA1 (~1M parameters) for tests, debugging and the demo: the `tiny` variant of
experiments/zaya1.py (an `arg` adds `section.field=value` extras, e.g. `zaya1_tiny.py:train.steps=5`)."""

import os

from zaya_jax.config import config_module


def get_config(arg=None):
    zaya1 = config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))
    return zaya1.get_config(",".join(filter(None, ("tiny", arg))))
