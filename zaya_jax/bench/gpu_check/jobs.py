"""Work that must run in a process of its own: the CPU side of the parity check and the planner (JAX_PLATFORMS=cpu
on an accelerator host), and kernel cases that need other XLA_FLAGS (XLA reads them once per process).

A job is a name in `JOBS` and a JSON spec. `start` returns a handle whose `result()` gives the job's JSON-able
result: on an accelerator host the job runs in a fresh process (`command` + `--job=NAME --job_spec=JSON
--job_out=FILE`, the launcher's hidden flags; started at once, so CPU jobs overlap the GPU sections), on a
CPU-only host lazily in this process. `run_job` is what the launcher calls in the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from zaya_jax.bench.gpu_check import cases, memory, parity, throughput


def _cpu_side(spec: dict) -> dict:
    """The CPU work, one part after the other in one process (on an accelerator host it runs while the device
    sections run, on one or two cores: little disturbance of the device's compile times): the parity reference
    losses, then the planner's memory figures per config."""
    reference = parity.reference_losses(int(spec["steps"]), bool(spec["fast_compile"]))
    plans = {c["name"]: memory.planned_memory(cases.ConfigRef.from_json(c), spec["hardware"]) for c in spec["configs"]}
    return {"reference": reference, "plans": plans}


def _throughput_case(spec: dict) -> list[dict]:
    planned = throughput.Planned(
        cases.ConfigRef.from_json(spec["config"]),
        cases.Case.from_json(spec["case"]),
        spec["label"],
        bool(spec["default"]),
        subprocess=False,
    )
    timing = throughput.Timing(**spec["timing"])
    return throughput.measure(planned, float(spec["gemm_peak"]), spec["sheet_peak"], timing)


JOBS: dict[str, Callable[[dict], Any]] = {
    "cpu_side": _cpu_side,
    "throughput_case": _throughput_case,
}
JOB_TIMEOUT_S = 900


def run_job(name: str, spec: dict, out_path: str) -> None:
    """Run job `name` in this process and write its result as JSON to `out_path`."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}; known: {sorted(JOBS)}")
    result = JOBS[name](spec)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


class Handle:
    """`result()` of a job: a child process's JSON output, or a call in this process."""

    def __init__(self, compute: Callable[[], Any]):
        self._compute, self._done, self._value = compute, False, None

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self._compute(), True
        return self._value


def _failure_line(text: str) -> str:
    """The line of a child's stderr that says what went wrong: the last one naming an error, else the last one."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    named = [x for x in lines if "Error" in x or "error" in x or "Unknown" in x]
    return (named or lines or ["no output"])[-1][:300]


def _spawned(name: str, spec: dict, command: Sequence[str], env: dict[str, str]) -> Handle:
    fd, out_path = tempfile.mkstemp(prefix=f"gpu_check_{name}_", suffix=".json")
    os.close(fd)
    err_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # a file, not a pipe: a chatty child never blocks
    argv = [*command, f"--job={name}", f"--job_spec={json.dumps(spec)}", f"--job_out={out_path}"]
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=err_file, text=True)

    def wait() -> Any:
        try:
            proc.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"job {name} ran over {JOB_TIMEOUT_S} s") from None
        try:
            if proc.returncode != 0:
                err_file.seek(0)
                raise RuntimeError(f"job {name} exited {proc.returncode}: {_failure_line(err_file.read())}")
            with open(out_path, encoding="utf-8") as f:
                return json.load(f)
        finally:
            err_file.close()
            os.unlink(out_path)

    return Handle(wait)


def start(name: str, spec: dict, *, command: Sequence[str] | None, env: dict[str, str] | None = None) -> Handle:
    """Start job `name`: in a child process running `command` with `env` added (None: lazily in this process,
    where `env` must be empty)."""
    if command is None:
        if env:
            raise ValueError(f"job {name} needs a process of its own ({env}); no command to start one")
        return Handle(lambda: JOBS[name](spec))
    return _spawned(name, spec, command, env or {})
