"""What every absl launcher does the same way: one line per error, exit codes, `--verbose`.

    from launch import cli
    if __name__ == "__main__":
        cli.run(main, "train")

* Flag and config problems (a missing config file, an unknown or misspelt `--config.*` field, a bad flag
  value) are caught while flags are parsed and reported as `PROG: error: ...` on one line.
* Errors the library raises for bad input or a failed operation (`zaya_jax.errors.ZayaError`: ConfigError,
  CheckpointError, LoadError, HFConversionError, ...; and DataError) are reported the same way; `--verbose`
  adds the traceback. Anything else is a bug or a crash and keeps its traceback.
* Exit codes: 0 success; EXIT_FAILURE (1) a failure that running again may not repeat (an I/O error during
  a save, a crash); EXIT_BAD_INPUT (78, sysexits' EX_CONFIG) bad input or usage: the same command fails the
  same way again, so `launch.supervise` does not restart it; EXIT_INTERRUPTED (130, the shell's Ctrl-C status)
  after a SIGINT that stopped the launcher (one line `PROG: interrupted`, whatever the interrupt landed in; the
  trainer's second Ctrl-C, see docs/reliability.md), which `launch.supervise` reads as an interruption, not a crash.
* Progress bars are closed before an error is printed (the line never ends up glued to a bar), and warnings
  raised by zaya_jax or launcher code print as `PROG: warning: ...`.
* Host setup before `main` (`jax_flags=True`, every launcher but the jax-free `launch.supervise`): jax's own
  options are flags too (`jax.config.config_with_absl()`: `--jax_platforms=cpu`, `--jax_num_cpu_devices=4`, ...),
  `--cpu_devices` emulates CPU devices (`launch.cpu_devices`), a persistent compilation cache is switched on
  (`compilation_cache`), jax's probe for a TPU runtime stays off the console, and a launcher started by
  `launch.supervise` stops when its supervisor dies (`zaya_jax.checkpoint.orphan.watch_supervisor`).
* `--config=experiments/NAME.py[:arg]` also works outside a checkout (after `pip install .`): a path under
  `experiments/` that does not exist relative to the working directory is looked up among the installed
  configs (`zaya_jax.config.resolve_config_path`).
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import sys
import traceback
import warnings
from typing import Callable, NoReturn

from absl import app, flags

from launch import cpu_devices
from zaya_jax.checkpoint.orphan import watch_supervisor
from zaya_jax.errors import ZayaError

EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 78, 130  # 130 = 128 + SIGINT, the shell's Ctrl-C status
_interrupted = False  # set by the SIGINT handler of `run`
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_DIRS = tuple(os.path.join(_REPO, name) + os.sep for name in ("zaya_jax", "launch"))
USER_CACHE = os.path.join("~", ".cache", "zaya_jax", "xla_cache")  # launchers without a workdir
USER_CACHE_MAX_BYTES = 8 << 30  # least recently used entries of the per-user cache go beyond this


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


def check_out_dir(prog: str, path: str, what: str = "the output") -> str:
    """`--out` of a launcher, checked before any work (one line, exit 78): not an existing file, and a folder that
    can be made and written (its nearest existing ancestor is a writable folder). Nothing is created here, so a
    refused command leaves the user's folders as they were. Returns the absolute path."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        fail(prog, f"--out={path} is an existing file; give a folder for {what}")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        fail(prog, f"--out={path}: {parent} is not a writable folder; give a folder {what} can be written to")
    return path


def fail_now(prog: str, err: BaseException) -> NoReturn:
    """`fail` for an error after which the process must not wait for its threads (a failed checkpoint write leaves
    Orbax threads waiting minutes for signals that never come): report `err` as `run` would, flush, `os._exit`.
    Only once everything that matters is on disk (the trainer's `abort` has run)."""
    verbose = "verbose" in flags.FLAGS and bool(flags.FLAGS["verbose"].value)
    if verbose or not isinstance(err, ZayaError):
        _close_progress_bars()
        traceback.print_exception(err)
    code = exit_code(err) if isinstance(err, ZayaError) else EXIT_FAILURE
    try:
        fail(prog, str(err) if isinstance(err, ZayaError) else f"{type(err).__name__}: {err}", code)
    except SystemExit:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def require_numbers(
    *names: str, minimum: float | None = None, above: float | None = None, maximum: float | None = None
) -> None:
    """Numeric flags `names` (when given) must be finite, >= minimum, > above and <= maximum; checked while the
    flags are parsed, so a bad value stops with one line before anything runs (absl's bounds let NaN through)."""
    bounds = [f">= {minimum:g}" if minimum is not None else "", f"> {above:g}" if above is not None else ""]
    bounds.append(f"<= {maximum:g}" if maximum is not None else "")
    what = " and ".join(["a finite number", *(b for b in bounds if b)])

    def ok(v) -> bool:
        if v is None:
            return True
        return (
            math.isfinite(v)
            and (minimum is None or v >= minimum)
            and (above is None or v > above)
            and (maximum is None or v <= maximum)
        )

    for name in names:
        flags.register_validator(name, ok, f"--{name} must be {what}", flag_values=flags.FLAGS)


def exit_code(err: BaseException) -> int:
    """EXIT_FAILURE for errors a rerun may not repeat (`permanent = False`), else EXIT_BAD_INPUT."""
    return EXIT_BAD_INPUT if getattr(err, "permanent", True) else EXIT_FAILURE


def _config_flag_names() -> list[str]:
    """Names of the `config_flags.DEFINE_config_*` flags (not of their `--config.x.y` override flags)."""
    return [
        name
        for name in flags.FLAGS
        if type(flags.FLAGS[name]).__module__.startswith("ml_collections") and "." not in name
    ]


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
                return f"--{name}: the config has no field {key.group(1)!r} in {parent}" + (
                    f"; did you mean {hint.group(1)!r}?" if hint else "; check the spelling"
                )
    cause = err.__cause__ or err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"


def _flag_error(err: BaseException) -> str:
    """absl's message for a bad flag; for a config file that raised while loading (ml_collections' config_flags
    embeds that error's whole traceback in it), `flag --config=...: ` and the raised error's message alone."""
    text = str(err)
    if "Traceback (most recent call last)" not in text:
        return text
    head = ":".join(text.split(":", 2)[:2])
    last = [line for line in text.splitlines() if line.strip()][-1].strip()  # the raised error, `pkg.mod.Type: msg`
    type_name, _, message = last.partition(": ")
    if isinstance(err.__context__, ZayaError):  # its message is the whole report (zaya_jax.errors)
        return f"{head}: {message}"
    return f"{head}: {type_name.rsplit('.', 1)[-1]}: {message}"


def _resolve_config_args(argv: list[str]) -> list[str]:
    """`--config=experiments/x.py[:arg]` → the installed copy when the path does not exist here."""
    from zaya_jax.config import resolve_config_path

    names = _config_flag_names()
    out = []
    for arg in argv:
        match = re.match(r"--(\w+)=(.*)", arg)
        if match and match.group(1) in names:
            arg = f"--{match.group(1)}={resolve_config_path(match.group(2))}"
        out.append(arg)
    return out


def _parse_flags(argv: list[str], prog: str) -> list[str]:
    try:
        rest = flags.FLAGS(_resolve_config_args(argv))
        for name in _config_flag_names():
            value = flags.FLAGS[name].value
            if value is not None:
                value.keys()  # a config file that failed to load raises here, not while parsing
    except flags.Error as err:
        fail(prog, _flag_error(err))
    except Exception as err:  # noqa: BLE001 - config files run arbitrary code; report it in one line
        fail(prog, _config_load_error(err, argv))
    return rest


def _on_sigint(signum, frame) -> NoReturn:
    """Ctrl-C: remember it (whatever it interrupts, e.g. an import that turns it into an ImportError, the
    launcher then reports an interruption) and raise KeyboardInterrupt."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Has this launcher received a SIGINT that raised (see `run`)?"""
    return _interrupted


def _report_interrupt(prog: str, err: BaseException) -> NoReturn:
    detail = str(err) if isinstance(err, KeyboardInterrupt) else ""
    _close_progress_bars()
    sys.stderr.flush()
    print(f"{prog}: interrupted" + (f": {detail}" if detail else ""), file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)


def _show_warning(prog: str, previous: Callable):
    def show(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(filename).startswith(_OWN_DIRS):
            tqdm = sys.modules.get("tqdm")  # clears and redraws progress bars around the line
            write = tqdm.tqdm.write if tqdm is not None else print
            write(f"{prog}: warning: {message}", file=file or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    return show


class _NoTpuProbe(logging.Filter):
    """Drops jax's INFO lines about the TPU runtime and the IFRT proxy it looks for on every start (this project
    never uses either), and the GPU plugins' tracebacks on a host without that GPU (the `gpu-compile` extra
    installs the CUDA and ROCm plugins everywhere; `zaya_jax.planning` uses them for compile-only work): the ROCm
    plugin's "No AMD GPUs were found", and the CUDA plugin's failed initialize() when no NVIDIA GPU is visible."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith("Jax plugin configuration error"):
            text = record.getMessage()
            if "xla_rocm" in text:
                error = record.exc_info[1] if record.exc_info else None
                return "No AMD GPUs were found" not in str(error)
            if "xla_cuda" in text:
                from jax._src import hardware_utils

                return hardware_utils.has_visible_nvidia_gpu()
            return True
        if not message.startswith("Unable to initialize backend"):
            return True
        return "'tpu'" not in record.getMessage() and "'proxy'" not in record.getMessage()


def compilation_cache(configured: str = "", default: str = USER_CACHE) -> str | None:
    """Switch on jax's persistent compilation cache; returns its directory (None: off).

    configured: a config field's value: a directory, "none" (off) or "" (keep a directory set by
    $JAX_COMPILATION_CACHE_DIR / --jax_compilation_cache_dir, else use `default`). The per-user default keeps
    at most USER_CACHE_MAX_BYTES (least recently used entries are dropped)."""
    import jax

    if configured.strip().lower() == "none":
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    directory = configured or jax.config.jax_compilation_cache_dir or default
    directory = os.path.abspath(os.path.expanduser(directory))
    if directory == os.path.abspath(os.path.expanduser(USER_CACHE)) and jax.config.jax_compilation_cache_max_size < 0:
        jax.config.update("jax_compilation_cache_max_size", USER_CACHE_MAX_BYTES)
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory


def _setup_host() -> None:
    """Emulated CPU devices and the compilation cache, from the parsed flags (before `main`)."""
    cpu_devices.apply_flag()
    configured = ""
    for name in _config_flag_names():
        config = flags.FLAGS[name].value
        if config is not None and "train" in config:
            configured = str(config.train.get("compilation_cache_dir", "") or "")
    workdir = flags.FLAGS["workdir"].value if "workdir" in flags.FLAGS else None
    compilation_cache(configured, os.path.join(workdir, "xla_cache") if workdir else USER_CACHE)


def _adopt_shared_flags() -> None:
    """`--help` lists the flags a launcher takes from shared modules of `launch/` (model_flags, cpu_devices,
    --verbose) with its own, not only under --helpfull: they become key flags of the main module."""
    main_module = sys.argv[0]
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if module != main_module and module.startswith("launch."):
            for flag in defined:
                flags.FLAGS.register_key_flag_for_module(main_module, flag)


def run(main: Callable[[list[str]], None], prog: str, *, jax_flags: bool = True) -> None:
    """`absl.app.run(main)` with the behaviour of the module docstring (`jax_flags=False`: no jax import)."""
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "Show the traceback of an error (default: one line).")
    _adopt_shared_flags()
    warnings.showwarning = _show_warning(prog, warnings.showwarning)
    if jax_flags:
        import jax

        jax.config.config_with_absl()
        logging.getLogger("jax._src.xla_bridge").addFilter(_NoTpuProbe())

    def guarded(argv: list[str]) -> None:
        signal.signal(signal.SIGINT, _on_sigint)
        try:
            if jax_flags:
                watch_supervisor()  # a supervised launcher stops when its supervisor dies
                _setup_host()
            main(argv)
        except SystemExit:
            raise
        except KeyboardInterrupt as err:
            _report_interrupt(prog, err)
        except ZayaError as err:
            if _interrupted:
                _report_interrupt(prog, err)
            if flags.FLAGS.verbose:
                _close_progress_bars()
                traceback.print_exc()
            fail(prog, str(err), exit_code(err))
        except BaseException as err:
            if _interrupted:  # e.g. an ImportError from an import the interrupt landed in: not a crash
                _report_interrupt(prog, err)
            _close_progress_bars()
            raise

    app.run(guarded, flags_parser=lambda argv: _parse_flags(argv, prog))
