"""`ConfigError`, the config layer's one error (a module of its own: `validate` and `numeric` both raise it)."""

from __future__ import annotations

from zaya_jax.errors import ZayaError


class ConfigError(ZayaError, ValueError):
    """A configuration value is invalid; the message names the field and what to do."""
