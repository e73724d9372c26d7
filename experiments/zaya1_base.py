"""ZAYA1-base (8.3B total / 760M active non-embedding parameters), docs/architecture.md §1, and the
paper's three training phases (arXiv 2511.17127) on the 1024 × MI300X cluster: the `base` and `phase1..3`
variants of experiments/zaya1.py (where the recipe and its sources are described).

    --config=experiments/zaya1_base.py          the released architecture (4k, θ = 1e6); count_params, tests
    --config=experiments/zaya1_base.py:phase1   web-heavy pretraining, 4k context, batch ramp
    --config=experiments/zaya1_base.py:phase2   math / code / STEM / structured-data phase, 4k context
    --config=experiments/zaya1_base.py:phase3   long-context + reasoning mid-training, 4k → 32k, new RoPE θ
"""

import os

from zaya_jax.config import ConfigError, config_module


def get_config(arg=None):
    zaya1 = config_module(os.path.join(os.path.dirname(__file__), "zaya1.py"))
    phase = (arg or "").split(",")[0]
    if phase and phase not in zaya1.PHASES:
        raise ConfigError(
            f"experiments/zaya1_base.py: unknown phase {phase!r}; choose one of {tuple(zaya1.PHASES)} "
            "(e.g. --config=experiments/zaya1_base.py:phase2) or no suffix for the architecture"
        )
    return zaya1.get_config(arg or "base")
