"""The README demo: a ~3M-parameter ZAYA1 pretrained on the Python standard library's source
(the embedded default corpus, byte-level tokens) on 8 emulated CPU devices as 2 data × 4 expert;
the `demo` variant of experiments/zaya1.py.

    python -m launch.train --config=experiments/zaya1_demo.py --workdir=runs/demo
"""

import os

from zaya_jax.config import config_module


def get_config(arg=None):
    zaya1 = config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))
    return zaya1.get_config(",".join(filter(None, ("demo", arg))))
