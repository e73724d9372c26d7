"""Keep Orbax's console output to what a user needs (no jax import).

* Orbax's per-save INFO lines (dozens per checkpoint) are dropped; its warnings pass, except those about
  situations this package handles and reports itself (a read-only directory opened on purpose, files missing
  from a damaged checkpoint). Its error reports of a failed background save (a full disk: one traceback per
  writer thread, hundreds of lines) are dropped too: the failure is raised to `Checkpointer` and reported in
  one line.
* When a restore fails on a damaged file, Orbax leaves other reads of the same restore pending; they later
  print pages of "exception was never retrieved" / "Event loop is closed" tracebacks with TensorStore specs.
  The failure itself is raised (and reported in one line) by `Checkpointer.restore`, so these echoes are dropped.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

_HANDLED_WARNINGS = (
    "Given directory is read only",
    "Metadata file does not exist",
    'Item "state" was found in the checkpoint, but could not be restored',
)
# Orbax's own reports of a failed background save (one per writer thread, each with a traceback): the failure is
# raised by `Checkpointer.wait` / `save` and reported there in one line
_SAVE_FAILURE_LOGS = (
    "_SignalingThread.run() raised an exception",
    "Failed to run",
    "Save Finalize thread",
)
_ECHOES = ("Encountered error while reading array index", "Event loop is closed")
_ECHO_SOURCES = ("OCDBT", "orbax", "TensorStore", "tensorstore")
_installed = False


class _OrbaxFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" not in record.pathname:
            return True
        if record.levelno >= logging.ERROR and any(m in record.getMessage() for m in _SAVE_FAILURE_LOGS):
            return False
        return record.levelno >= logging.WARNING and not str(record.msg).startswith(_HANDLED_WARNINGS)


class _EchoFilter(logging.Filter):
    """asyncio's "exception was never retrieved" reports of Orbax / TensorStore reads."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if any(echo in msg for echo in _ECHOES):
            return False
        return not ("was never retrieved" in msg and any(src in msg for src in _ECHO_SOURCES))


def first_line(err: BaseException, limit: int = 240) -> str:
    """'Type: message' of the innermost cause of `err`, first line only, without TensorStore spec dumps."""
    while err.__cause__ is not None:
        err = err.__cause__
    text = (str(err).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0]
    return f"{type(err).__name__}: {text[:limit]}".rstrip(": ")


def quiet_orbax() -> None:
    """Install the filters above (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    logging.getLogger("absl").addFilter(_OrbaxFilter())
    logging.getLogger("asyncio").addFilter(_EchoFilter())
    warnings.filterwarnings(
        "ignore",
        category=RuntimeWarning,
        message=r"coroutine '(_read_array_index_and_device_put|"
        r"async_deserialize|Store\._get_array_metadatas)' was never awaited",
    )
    previous = sys.unraisablehook

    def hook(unraisable):
        if not any(echo in str(unraisable.exc_value) for echo in _ECHOES):
            previous(unraisable)

    sys.unraisablehook = hook
