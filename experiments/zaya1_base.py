"""ZAYA1-base (8.3B total / 760M active non-embedding parameters), `zaya1-architecture.md` §1.

Usage: --config=experiments/zaya1_base.py
"""

from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()  # model defaults are the released ZAYA1-base geometry
    config.train.seq_len = 4096
    config.model.dtype = "bfloat16"
    config.model.remat = "full"
    config.mesh.data = -1
    return config
