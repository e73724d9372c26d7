"""Error types of the checkpoint package (no jax import), `zaya_jax.errors.ZayaError`s.

`permanent` tells a launcher (and through its exit code, `launch.supervise`) whether running the same
command again can succeed: a failed save on a flaky disk may, a config that does not match the checkpoint
or a workdir held by another trainer will not.
"""

from __future__ import annotations

from zaya_jax.errors import ZayaError


class CheckpointError(ZayaError, ValueError):
    """A checkpoint cannot be saved, found or restored; the one-line message names what and where."""

    permanent = False


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint exists but cannot be read, or its data does not match its checksums."""


class CheckpointConfigError(CheckpointError):
    """The request cannot succeed as given (the config does not match the checkpoint, a bad directory, a run that
    keeps diverging): retrying the same command fails the same way."""

    permanent = True


class WorkdirLockedError(CheckpointConfigError):
    """Another live process holds the workdir / checkpoint-directory lock."""
