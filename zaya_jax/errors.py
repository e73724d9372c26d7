"""The base class of the library's one-line errors (imports nothing; every package may import it).

A `ZayaError`'s message is the whole report: what was wrong and what to do. The launchers catch it by type
(`launch.cli.run`) and print `PROG: error: MESSAGE` on one line; `permanent` picks the exit code: True (the
default) means the same command fails the same way again (bad input or usage, exit 78, which `launch.supervise`
does not restart), False that a rerun may succeed (e.g. a save on a flaky disk, exit 1). Each package keeps its
own subclass, which also derives from the built-in error it always was (`ConfigError` is still a `ValueError`).
"""

from __future__ import annotations


class ZayaError(Exception):
    """An error with a one-line message naming what was wrong and what to do."""

    permanent = True
