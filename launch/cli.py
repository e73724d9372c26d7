"""What every absl launcher does the same way: one line per error, exit codes, `--verbose`.

    from launch import cli
    if __name__ == "__main__":
        cli.run(main, "train")

* Flag and config problems (a missing config file, an unknown or misspelt `--config.*` field, a bad flag
  value) are caught while flags are parsed and reported as `PROG: error: ...` on one line.
* Errors the library raises for bad input or a failed operation (ConfigError, DataError, CheckpointError,
  LoadError, HFConversionError) are reported the same way; `--verbose` adds the traceback. Anything else is
  a bug or a crash and keeps its traceback.
* Exit codes: 0 success; EXIT_FAILURE (1) a failure that running again may not repeat (an I/O error during
  a save, a crash); EXIT_BAD_INPUT (78, sysexits' EX_CONFIG) bad input or usage: the same command fails the
  same way again, so `launch.supervise` does not restart it.
* Progress bars are closed before an error is printed (the line never ends up glued to a bar), and warnings
  raised by zaya_jax code print as `PROG: warning: ...`.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import warnings
from typing import Callable, NoReturn

from absl import app, flags

EXIT_FAILURE, EXIT_BAD_INPUT = 1, 78
_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "zaya_jax")
# (module, class) of the library's one-line errors; a class can only be raised once its module is imported
_KNOWN = (("zaya_jax.config", "ConfigError"), ("zaya_jax.data.tokenizer", "DataError"),
          ("zaya_jax.checkpoint.errors", "CheckpointError"), ("zaya_jax.hf.config", "HFConversionError"),
          ("zaya_jax.inference.loading", "LoadError"))


def _close_progress_bars() -> None:
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - best effort: never hide the error being reported
            pass


def fail(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `PROG: error: MESSAGE` (one line, after closing progress bars) and exit with `code`."""
    _close_progress_bars()
    sys.stderr.flush()
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def known_errors() -> tuple[type, ...]:
    return tuple(getattr(sys.modules[m], name) for m, name in _KNOWN if m in sys.modules)


def exit_code(err: BaseException) -> int:
    """EXIT_FAILURE for errors a rerun may not repeat (`permanent = False`), else EXIT_BAD_INPUT."""
    return EXIT_BAD_INPUT if getattr(err, "permanent", True) else EXIT_FAILURE


def _config_flag_names() -> list[str]:
    """Names of the `config_flags.DEFINE_config_*` flags (not of their `--config.x.y` override flags)."""
    return [name for name in flags.FLAGS if type(flags.FLAGS[name]).__module__.startswith("ml_collections")
            and "." not in name]


def _config_load_error(err: BaseException, argv: list[str]) -> str:
    """A one-line description of a config file that failed to load or an override that does not apply."""
    for arg in argv:
        match = re.match(r"--(\w+)=(.*)", arg)
        if match and match.group(1) in _config_flag_names():
            path = match.group(2).split(":", 1)[0]
            if not os.path.exists(path):
                return f"--{match.group(1)}: config file {path!r} does not exist; pass e.g. experiments/zaya1_tiny.py"
    text = str(err).replace("\\n", "\n").replace("\\'", "'")
    key = re.search(r"'([^'\s]+)'", text)
    if isinstance(err, (AttributeError, KeyError)) and key:
        hint = re.search(r'Did you mean "([^"]+)"', text)
        for arg in argv:
            name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
            if key.group(1) in name.split(".")[1:]:
                parent = name[: name.index(key.group(1))].rstrip(".")
                return (f"--{name}: the config has no field {key.group(1)!r} in {parent}"
                        + (f"; did you mean {hint.group(1)!r}?" if hint else "; check the spelling"))
    cause = err.__cause__ or err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"


def _parse_flags(argv: list[str], prog: str) -> list[str]:
    try:
        rest = flags.FLAGS(argv)
        for name in _config_flag_names():
            value = flags.FLAGS[name].value
            if value is not None:
                value.keys()  # a config file that failed to load raises here, not while parsing
    except flags.Error as err:
        fail(prog, str(err))
    except Exception as err:  # noqa: BLE001 - config files run arbitrary code; report it in one line
        fail(prog, _config_load_error(err, argv))
    return rest


def _show_warning(prog: str, previous: Callable):
    def show(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(filename).startswith(_PACKAGE_DIR):
            tqdm = sys.modules.get("tqdm")  # clears and redraws progress bars around the line
            write = tqdm.tqdm.write if tqdm is not None else print
            write(f"{prog}: warning: {message}", file=file or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)
    return show


def run(main: Callable[[list[str]], None], prog: str) -> None:
    """`absl.app.run(main)` with the behaviour of the module docstring."""
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "Show the traceback of an error (default: one line).")
    warnings.showwarning = _show_warning(prog, warnings.showwarning)

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except known_errors() as err:
            if flags.FLAGS.verbose:
                _close_progress_bars()
                traceback.print_exc()
            fail(prog, str(err), exit_code(err))
        except BaseException:
            _close_progress_bars()
            raise

    app.run(guarded, flags_parser=lambda argv: _parse_flags(argv, prog))
