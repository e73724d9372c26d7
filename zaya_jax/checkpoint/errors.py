"""The one error type of the checkpoint package."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint cannot be saved, found or restored; the one-line message names what and where."""


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint exists but cannot be read (truncated / damaged files)."""
