"""Fault injection for fault-tolerance tests: `ZAYA_FAULTS="crash@5,hang@9,nan@12"` or `checkpoint.faults`.

Each entry is `kind@step` (or `kind@step:arg`) and fires once, at the first opportunity at or after
`step`. Fired faults are recorded in `<workdir>/faults_fired.json` *before* they act, so a restarted
trainer does not fire them again. Kinds:

    crash                raise an exception after the step (process exits 1)
    hang                 stop making progress (sleep forever; the supervisor's watchdog must kill it)
    nan                  poison the parameters and report a NaN loss (the loss guard must roll back)
    spike                report a loss 100× too large (needs checkpoint.spike_zscore > 0)
    sigkill              SIGKILL this process after the step
    sigkill_during_save  SIGKILL this process while an async checkpoint save is in flight (uncommitted)
    sigterm              SIGTERM this process (preemption: finish the step, save, exit 0)
    corrupt_checkpoint   after the next save commits, damage it, then crash; `corrupt_checkpoint@8:MODE` with
                         MODE truncate (every state file, the default), bitflip (one bit in every state data
                         file), drop_state_metadata (state/_METADATA), drop_meta (the JSON item), drop_data (the
                         largest state data file)
    device_loss:N        declare only N devices available (file `<workdir>/available_devices`), then crash
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from zaya_jax.checkpoint.errors import CheckpointConfigError, CheckpointError
from zaya_jax.checkpoint.events import EventLog, _atomic_write_json, read_json

FAULTS_ENV = "ZAYA_FAULTS"
KINDS = (
    "crash",
    "hang",
    "nan",
    "spike",
    "sigkill",
    "sigkill_during_save",
    "sigterm",
    "corrupt_checkpoint",
    "device_loss",
)
CORRUPTIONS = ("truncate", "bitflip", "drop_state_metadata", "drop_meta", "drop_data")
STATE_FILE = "faults_fired.json"
DEVICES_FILE = "available_devices"


class InjectedFault(RuntimeError):
    """Raised by an injected `crash` (and after `corrupt_checkpoint` / `device_loss`)."""


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    arg: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.step}" + (f":{self.arg}" if self.arg else "")


def parse_faults(spec: str) -> list[Fault]:
    """`"crash@5,device_loss@9:4"` → [Fault('crash', 5), Fault('device_loss', 9, '4')]; raises CheckpointError."""
    faults = []
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        kind, sep, rest = item.partition("@")
        at, _, arg = rest.partition(":")
        if not sep or kind not in KINDS or not at.isdigit():
            raise CheckpointConfigError(f"fault {item!r}: expected kind@step with kind in {', '.join(KINDS)}")
        if kind == "device_loss" and not arg.isdigit():
            raise CheckpointConfigError(f"fault {item!r}: device_loss needs a device count, e.g. device_loss@{at}:4")
        if kind == "corrupt_checkpoint" and arg and arg not in CORRUPTIONS:
            raise CheckpointConfigError(f"fault {item!r}: corruption mode must be one of {', '.join(CORRUPTIONS)}")
        faults.append(Fault(kind, int(at), arg))
    return faults


class FaultInjector:
    """Decides when a configured fault is due, records it, and performs the process-level ones."""

    def __init__(self, faults: list[Fault], workdir: str, events: EventLog, *, enabled: bool = True):
        self.faults, self.workdir, self.events = faults, workdir, events
        self.enabled = enabled and bool(faults)
        self.state_file = os.path.join(workdir, STATE_FILE)
        self.fired: set[str] = set(read_json(self.state_file, [])) if self.enabled else set()

    @classmethod
    def from_config(cls, config, workdir: str, events: EventLog, *, enabled: bool = True) -> "FaultInjector":
        spec = ",".join(s for s in (config.checkpoint.faults, os.environ.get(FAULTS_ENV, "")) if s)
        return cls(parse_faults(spec), workdir, events, enabled=enabled)

    def due(self, kind: str, step: int) -> Fault | None:
        """The first unfired fault of `kind` scheduled at or before `step`."""
        if not self.enabled:
            return None
        for fault in self.faults:
            if fault.kind == kind and fault.step <= step and fault.name not in self.fired:
                return fault
        return None

    def record(self, fault: Fault, step: int, **info) -> None:
        """Mark `fault` fired (state file first, so it survives the fault itself) and log the event."""
        self.fired.add(fault.name)
        _atomic_write_json(self.state_file, sorted(self.fired))
        self.events.write("fault", kind=fault.kind, fault=fault.name, step=int(step), **info)

    def process_faults(self, step: int) -> None:
        """Faults that act on the whole process after a step: crash, hang, sigkill, sigterm, device_loss."""
        if fault := self.due("sigterm", step):
            self.record(fault, step)
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the trainer: save, then exit 0
        if fault := self.due("device_loss", step):
            _atomic_write_json(os.path.join(self.workdir, DEVICES_FILE), int(fault.arg))
            self.record(fault, step, available_devices=int(fault.arg))
            raise InjectedFault(f"injected device loss at step {step}: {fault.arg} devices left")
        if fault := self.due("crash", step):
            self.record(fault, step)
            raise InjectedFault(f"injected crash at step {step}")
        if fault := self.due("sigkill", step):
            self.record(fault, step)
            os.kill(os.getpid(), signal.SIGKILL)
        if fault := self.due("hang", step):
            self.record(fault, step)
            while True:  # no heartbeat from here on
                time.sleep(3600)

    def kill_now(self, fault: Fault, step: int, **info) -> None:
        self.record(fault, step, **info)
        os.kill(os.getpid(), signal.SIGKILL)


def _state_files(step_dir: str, data_only: bool = False) -> list[str]:
    out = []
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
        if data_only and os.path.basename(root) != "d":
            continue
        out += [os.path.join(root, name) for name in sorted(files)]
    return out


def corrupt_step_dir(step_dir: str, mode: str = "truncate") -> list[str]:
    """Damage a committed step as a bad disk / torn write / bit rot would (modes: see the module docstring);
    returns the damaged files, relative to `step_dir`."""
    if mode == "drop_state_metadata":
        damaged = [os.path.join(step_dir, "state", "_METADATA")]
    elif mode == "drop_meta":
        damaged = [os.path.join(step_dir, "meta", "metadata")]
    elif mode == "drop_data":
        damaged = sorted(_state_files(step_dir, data_only=True), key=os.path.getsize)[-1:]
    else:
        damaged = _state_files(step_dir, data_only=mode == "bitflip")
    damaged = [p for p in damaged if os.path.exists(p)]
    if not damaged:
        raise CheckpointError(f"{step_dir}: nothing to corrupt (no state files)")
    for path in damaged:
        if mode.startswith("drop"):
            os.remove(path)
            continue
        with open(path, "r+b") as f:
            if mode == "truncate":
                f.truncate(0)
                continue
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            if byte:
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0x04]))
    return [os.path.relpath(p, step_dir) for p in damaged]


def available_devices_file(workdir: str) -> str:
    return os.path.join(workdir, DEVICES_FILE)


def read_available_devices(path: str) -> int | None:
    value = read_json(path)
    return int(value) if isinstance(value, int) and value > 0 else None


__all__ = [
    "FAULTS_ENV",
    "KINDS",
    "Fault",
    "FaultInjector",
    "InjectedFault",
    "corrupt_step_dir",
    "parse_faults",
    "available_devices_file",
    "read_available_devices",
]
