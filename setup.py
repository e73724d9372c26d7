"""Packages: zaya_jax and launch, plus the experiment configs of experiments/ installed as zaya_jax.experiments
(so `--config=experiments/NAME.py` works after a non-editable install; `zaya_jax.config.resolve_config_path`).
Everything else is in setup.cfg."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["zaya_jax", "zaya_jax.*", "launch", "launch.*"]) + ["zaya_jax.experiments"],
    package_dir={"zaya_jax.experiments": "experiments"},
)
