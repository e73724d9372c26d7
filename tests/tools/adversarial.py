"""The adversarial reliability set, end to end, with a Markdown report of the counts.

    python -m tests.tools.adversarial --out=docs/reliability_report.md            # everything (~25 min on 2 cores)
    python -m tests.tools.adversarial --only=inputs,files --out=/tmp/report.md    # a part

* faults: supervised tiny-config runs with injected faults (tests/tools/reliability_cases.py: `fault_outcomes`),
  plus scenarios a fault string cannot express (two trainers on one workdir, a stale lock, a wrapper between
  supervisor and trainer, SIGTERM to the supervisor, Ctrl-C twice, bit rot of the two newest checkpoints).
  For each fault: the newest intact committed step when it hit, the step training resumed from, and the
  committed steps lost (must be 0 whenever an intact checkpoint existed).
* files: every file of a checkpoint deleted / truncated / bit-flipped (`damaged_file_sweep`).
* inputs: every bad input of `BAD_INPUTS` must end in one line `PROG: error: ...` and exit status 78.

The test suite runs the `ci` bad inputs, the sweep (delete / bitflip) and one supervised fault run; this
script is the complete set, run by hand before a release.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.tools.checkpoint_helpers import REPO, STEPS, env_for, metric_rows, train_cmd  # noqa: E402
from tests.tools.reliability_cases import (  # noqa: E402
    BAD_INPUTS,
    damaged_file_sweep,
    error_problem,
    fault_outcomes,
    make_context,
    run_bad_input,
    summary_of,
)
from zaya_jax.checkpoint.events import read_events  # noqa: E402
from zaya_jax.checkpoint.faults import corrupt_step_dir  # noqa: E402

DEVICES = 4
LONG = "--config.train.steps=40"  # runs that are interrupted on purpose must still be running when that happens
SUPERVISE = [
    "--heartbeat_timeout=20",
    "--startup_timeout=600",
    "--backoff=0.1",
    "--max_backoff=1",
    "--max_restarts=12",
    "--poll=0.2",
]
# fault strings of the supervised runs (checkpoint every 2 of 8 steps, 4 devices, batch 8)
RUNS = {
    "A": ("crash@2,nan@3,sigkill_during_save@4,hang@5,sigterm@6,device_loss@7:3,corrupt_checkpoint@8", []),
    "B": (
        "sigkill@1,device_loss@2:5,crash@3,corrupt_checkpoint@4:bitflip,sigkill@5,"
        "corrupt_checkpoint@6:drop_state_metadata,sigterm@7,corrupt_checkpoint@8:drop_meta",
        [],
    ),
    # the spike comes after 4 losses of one process (the guard's window)
    "C": (
        "spike@5,corrupt_checkpoint@6:drop_data,device_loss@7:1,hang@8",
        ["--config.checkpoint.spike_zscore=10", "--config.checkpoint.spike_window=4"],
    ),
    "D": ("corrupt_checkpoint@2:drop_data", []),  # the only checkpoint damaged: start again from step 0
}


def _supervise(
    workdir: str, data: str, faults: str, extra: list[str], wrapper: list[str] | None = None
) -> subprocess.Popen:
    """A supervised trainer; its console output goes to `<workdir>.log` (read it with `_log`)."""
    cmd = [
        sys.executable,
        "-m",
        "launch.supervise",
        f"--workdir={workdir}",
        *SUPERVISE,
        "--",
        *(wrapper or []),
        *train_cmd(workdir, data, DEVICES, *extra),
    ]
    with open(workdir + ".log", "w") as log:
        return subprocess.Popen(
            cmd, cwd=REPO, env=env_for(None, ZAYA_FAULTS=faults), text=True, stdout=log, stderr=subprocess.STDOUT
        )


def _log(workdir: str) -> str:
    with open(workdir + ".log", errors="replace") as f:
        return f.read()


def _trainer(workdir: str, data: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        train_cmd(workdir, data, DEVICES, *extra),
        cwd=REPO,
        env=env_for(None),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for(path: str, pred, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and pred():
            return
        time.sleep(0.5)
    raise TimeoutError(path)


def _committed(workdir: str) -> list[int]:
    d = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _restored(workdir: str, pid: int | None = None) -> int | None:
    rows = [r for r in read_events(os.path.join(workdir, "events.jsonl")) if pid is None or r.get("pid") == pid]
    starts = [r for r in rows if r["event"] in ("restored", "fresh_start")]
    return int(starts[-1]["step"]) if starts else None


def _interrupt_and_rerun(w: str, data: str, after: int, *signals: int, supervised: bool = False):
    """Start a long run, send `signals` once step `after` is committed, then run the trainer again.
    Returns (newest committed step before the rerun, the first process, the rerun)."""
    first = _supervise(w, data, "", [LONG]) if supervised else _trainer(w, data, LONG)
    _wait_for(os.path.join(w, "heartbeat.json"), lambda: any(s >= after for s in _committed(w)))
    for sig in signals:
        first.send_signal(sig)
        time.sleep(0.2)
    first.wait(timeout=600)
    good = max(_committed(w))
    again = subprocess.run(
        train_cmd(w, data, DEVICES, LONG), cwd=REPO, env=env_for(None), capture_output=True, text=True, timeout=1200
    )
    return good, first, again


def _outcome(run: str, fault: str, good, resumed, note: str = "") -> dict:
    lost = None if good is None or resumed is None else good - resumed
    return {"run": run, "fault": fault, "good": good, "resumed": resumed, "lost": lost, "note": note}


def supervised_runs(root: str, data: str) -> list[dict]:
    out = []
    for name, (faults, extra) in RUNS.items():
        workdir = os.path.join(root, f"run_{name}")
        proc = _supervise(workdir, data, faults, extra)
        proc.wait(timeout=3600)
        err = _log(workdir)
        rows = read_events(os.path.join(workdir, "events.jsonl"))
        s = summary_of(rows)
        note = f"supervisor exit {proc.returncode}, final step {s.get('final_step')}, restarts {s.get('restarts')}"
        for o in fault_outcomes(rows):
            out.append(_outcome(name, o["fault"], o["good"], o["resumed"], note))
        if proc.returncode != 0 or s.get("final_step") != STEPS:
            out.append(_outcome(name, "(run did not finish)", 0, None, err[-300:]))
    return out


def scenarios(root: str, data: str) -> list[dict]:
    out = []
    # two trainers on one workdir: the second refuses in one line, the first is untouched
    w = os.path.join(root, "two_trainers")
    first = _trainer(w, data, LONG)
    _wait_for(os.path.join(w, "heartbeat.json"), lambda: 2 in _committed(w))
    second = subprocess.run(
        train_cmd(w, data, DEVICES, LONG), cwd=REPO, env=env_for(None), capture_output=True, text=True, timeout=600
    )
    first.wait(timeout=1200)
    steps = [r["step"] for r in metric_rows(w) if "loss" in r]
    ok = first.returncode == 0 and error_problem(second, "train") is None and steps == list(range(1, 41))
    out.append(
        _outcome(
            "S",
            "second trainer on the same workdir",
            2,
            2 if ok else None,
            f"second: {second.stderr.strip().splitlines()[-1][:120]}; first exit {first.returncode}",
        )
    )
    # a stale lock: SIGKILL mid-run, an unsupervised restart takes the lock over and resumes
    w = os.path.join(root, "stale_lock")
    good, first, again = _interrupt_and_rerun(w, data, 4, signal.SIGKILL)
    took_over = any(r["event"] == "lock_takeover" for r in read_events(os.path.join(w, "events.jsonl")))
    out.append(
        _outcome(
            "S",
            "SIGKILL, stale lock left behind",
            good,
            _restored(w) if took_over else None,
            f"rerun exit {again.returncode}, lock taken over: {took_over}",
        )
    )
    # SIGTERM to the supervisor: forwarded, the trainer saves and stops; a rerun resumes there
    w = os.path.join(root, "sigterm_supervisor")
    good, first, again = _interrupt_and_rerun(w, data, 2, signal.SIGTERM, supervised=True)
    out.append(
        _outcome(
            "S",
            "SIGTERM to the supervisor",
            good,
            _restored(w),
            f"supervisor exit {first.returncode}, rerun exit {again.returncode}",
        )
    )
    # Ctrl-C twice: the in-flight save commits; a rerun resumes from the newest committed step
    w = os.path.join(root, "ctrl_c")
    good, first, again = _interrupt_and_rerun(w, data, 2, signal.SIGINT, signal.SIGINT)
    out.append(_outcome("S", "SIGINT twice (Ctrl-C)", good, _restored(w), f"first exit {first.returncode}"))
    # a wrapper between supervisor and trainer (timeout forks), with a crash to restart through it
    w = os.path.join(root, "wrapped")
    proc = _supervise(w, data, "crash@3", [], wrapper=["timeout", "900"])
    proc.wait(timeout=1800)
    rows = read_events(os.path.join(w, "events.jsonl"))
    hangs = sum(r["event"] == "hang_detected" for r in rows)
    for o in fault_outcomes(rows):
        out.append(
            _outcome(
                "S",
                f"{o['fault']} under `timeout`",
                o["good"],
                o["resumed"],
                f"final step {summary_of(rows).get('final_step')}, hangs detected {hangs}",
            )
        )
    # bit rot in the two newest checkpoints while stopped: the restart falls back two steps
    w = os.path.join(root, "two_rotten")
    subprocess.run(
        train_cmd(w, data, DEVICES, "--config.train.steps=6"),
        cwd=REPO,
        env=env_for(None),
        capture_output=True,
        timeout=1200,
    )
    for step in (6, 4):
        corrupt_step_dir(os.path.join(w, "checkpoints", str(step)), "bitflip")
    subprocess.run(train_cmd(w, data, DEVICES), cwd=REPO, env=env_for(None), capture_output=True, timeout=1200)
    out.append(_outcome("S", "bit rot in steps 6 and 4", 2, _restored(w), "2 is the newest intact step"))
    # NaN before any checkpoint: nothing to roll back to; one line, exit 78, not restarted
    w = os.path.join(root, "early_nan")
    proc = _supervise(w, data, "nan@1", [])
    proc.wait(timeout=1200)
    lines = [line for line in _log(w).splitlines() if line.startswith("train: error:")]
    starts = sum(r["event"] == "child_start" for r in read_events(os.path.join(w, "events.jsonl")))
    out.append(
        _outcome(
            "S",
            "NaN at step 1, no checkpoint yet",
            None,
            None,
            f"supervisor exit {proc.returncode}, trainer starts {starts}, {lines[-1][:100] if lines else ''}",
        )
    )
    return out


def _table(rows: list[dict], cols: list[str]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")).replace("|", "\\|").replace("\n", " ") for c in cols) + " |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="Markdown report path (default: print only)")
    p.add_argument("--only", default="faults,files,inputs")
    p.add_argument("--root", default=None, help="scratch directory (default: a new temporary one)")
    args = p.parse_args()
    parts = set(args.only.split(","))
    root = args.root or tempfile.mkdtemp(prefix="zaya_adversarial_")
    start = time.time()
    ctx = make_context(os.path.join(root, "ctx"))
    report, counts = [], {}
    if "faults" in parts:
        faults = supervised_runs(root, ctx.data) + scenarios(root, ctx.data)
        counted = [f for f in faults if f["good"] is not None]
        counts["faults"] = len(faults)
        counts["faults_with_a_good_checkpoint"] = len(counted)
        counts["committed_steps_lost"] = sum(f["lost"] for f in counted if f["lost"] is not None)
        counts["faults_not_recovered"] = sum(f["resumed"] is None for f in counted)
        report += ["## Injected faults", "", *_table(faults, ["run", "fault", "good", "resumed", "lost", "note"]), ""]
    if "files" in parts:
        cases = damaged_file_sweep(os.path.join(root, "sweep"), ("delete", "truncate", "bitflip"))
        counts["damaged_files"] = len(cases)
        counts["damaged_files_fell_back"] = sum(c["restored"] == 2 for c in cases)
        counts["damaged_files_wrong_or_failed"] = sum(c["problem"] is not None for c in cases)
        bad = [c for c in cases if c["problem"]]
        report += [
            "## Damaged checkpoint files",
            "",
            f"{len(cases)} cases; {counts['damaged_files_fell_back']} fell back to the previous step, the rest "
            "restored the damaged step bit-identical (the file was not needed); problems:",
            "",
            *(_table(bad, ["file", "mode", "problem"]) if bad else ["none"]),
            "",
        ]
    if "inputs" in parts:
        rows = []
        for case in BAD_INPUTS:
            proc = run_bad_input(case, ctx)
            problem = error_problem(proc, case.prog, expect=case.expect)
            last = (proc.stderr.strip().splitlines() or [""])[-1]
            rows.append(
                {
                    "launcher": case.prog,
                    "input": case.name,
                    "ok": problem is None,
                    "output": last[:160] if problem is None else problem[:160],
                }
            )
        counts["bad_inputs"] = len(rows)
        counts["bad_inputs_one_line"] = sum(r["ok"] for r in rows)
        report += ["## Bad inputs", "", *_table(rows, ["launcher", "input", "ok", "output"]), ""]
    counts["minutes"] = round((time.time() - start) / 60, 1)
    head = [
        "# Adversarial reliability run",
        "",
        f"`python -m tests.tools.adversarial` on {os.uname().nodename}, {time.strftime('%Y-%m-%d')}.",
        "",
        "```",
        json.dumps(counts, indent=1),
        "```",
        "",
    ]
    text = "\n".join(head + report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps(counts, indent=1))
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    failed = (
        counts.get("committed_steps_lost", 0)
        or counts.get("faults_not_recovered", 0)
        or counts.get("damaged_files_wrong_or_failed", 0)
        or counts.get("bad_inputs", 0) != counts.get("bad_inputs_one_line", 0)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
