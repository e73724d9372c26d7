"""Test setup: 8 emulated CPU devices, set before jax is imported anywhere."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from zaya_jax import host_memory  # noqa: E402

# pytest-xdist workers and launcher subprocesses inherit it (huge pages for XLA's per-step buffers)
os.environ.update(host_memory.huge_page_env())

from absl import flags  # noqa: E402

# Grain worker processes and absl-aware code read flags; mark them parsed outside absl.app.run.
flags.FLAGS.mark_as_parsed()

import jax  # noqa: E402

# Broadcasting between arrays of different ranks must be explicit in library and test code (`layers.lead`).
jax.config.update("jax_numpy_rank_promotion", "raise")
