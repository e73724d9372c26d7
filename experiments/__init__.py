"""Experiment configs: ml_collections files loaded by path (`--config=experiments/NAME.py[:arg]`); installed as
`zaya_jax/experiments/` so the launchers find them outside a checkout too (`zaya_jax.config.resolve_config_path`)."""
