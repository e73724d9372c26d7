"""Every number of a config is finite and in range before anything is compiled (zaya_jax/config/numeric.py)."""

from __future__ import annotations

import pytest

from zaya_jax.config import ConfigError, default_config, validate

CASES = [
    ("optimizer", "learning_rate", -1.0, "optimizer.learning_rate=-1.0 must be >= 0"),
    ("optimizer", "learning_rate", float("nan"), "optimizer.learning_rate=nan must be a finite number"),
    ("optimizer", "adam_learning_rate", float("inf"), "optimizer.adam_learning_rate=inf must be a finite number"),
    ("optimizer", "adam_b2", 1.0, "optimizer.adam_b2=1.0 must be in [0, 1)"),
    ("optimizer", "adam_eps", 0.0, "optimizer.adam_eps=0.0 must be > 0"),
    ("optimizer", "weight_decay", -0.1, "optimizer.weight_decay=-0.1 must be >= 0"),
    ("optimizer", "grad_clip_norm", -1.0, "optimizer.grad_clip_norm=-1.0 must be >= 0"),
    ("optimizer", "min_lr_ratio", 1.5, "optimizer.min_lr_ratio=1.5 must be in [0, 1]"),
    ("model", "initializer_range", float("nan"), "model.initializer_range=nan must be a finite number"),
    ("model", "rope_theta", float("inf"), "model.rope_theta=inf must be a finite number"),
    ("train", "z_loss", -1e-4, "train.z_loss=-0.0001 must be >= 0"),
    ("train", "peak_tflops", float("nan"), "train.peak_tflops=nan must be a finite number"),
    ("balancing", "kp", float("nan"), "balancing.kp=nan must be a finite number"),
    ("balancing", "warn_dropped", 2.0, "balancing.warn_dropped=2.0 must be in [0, 1]"),
    ("data", "weights", (1.0, float("nan")), "data.weights=nan must be a finite number"),
]


@pytest.mark.parametrize("section, field, value, message", CASES, ids=[f"{c[0]}.{c[1]}={c[2]}" for c in CASES])
def test_a_bad_number_is_one_line_naming_the_field(section, field, value, message):
    config = default_config()
    config[section][field] = value
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert str(err.value) == message


def test_the_defaults_and_zero_learning_rates_pass():
    config = default_config()
    config.optimizer.learning_rate = config.optimizer.adam_learning_rate = 0.0  # frozen weights: allowed
    validate(config)
