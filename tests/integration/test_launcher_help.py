"""`--help` of a launcher lists the flags it takes from shared modules (launch/model_flags.py, --verbose),
not only its own module's (absl shows other modules' flags under --helpfull only); an `--out` that cannot be
written is refused before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tools.checkpoint_helpers import REPO, env_for


@pytest.mark.parametrize(
    "prog, expected",
    [
        ("eval", ("--checkpoint", "--hf", "--tokenizer", "--data", "--verbose")),
        ("generate", ("--checkpoint", "--hf", "--tokenizer", "--max_new_tokens", "--verbose")),
        ("supervise", ("--orphan_grace", "--startup_timeout", "--verbose")),
    ],
)
def test_help_lists_the_launchers_flags(prog, expected):
    proc = subprocess.run(
        [sys.executable, "-m", f"launch.{prog}", "--help"],
        cwd=REPO,
        env=env_for(None),
        capture_output=True,
        text=True,
        timeout=120,
    )
    listed = {line.split(":")[0].strip().replace("--[no]", "--") for line in proc.stdout.splitlines()}
    missing = [f for f in expected if f not in listed]
    assert not missing, (missing, proc.stdout[-1500:])  # absl exits 1 after --help


@pytest.mark.parametrize(
    "prog, args",
    [
        ("bench", ("--suite=gemm", "--quick")),
        ("balance_report", ("--runs=a=does_not_exist",)),
        ("plan", ("--config=experiments/zaya1_tiny.py", "--sweep=data:2")),
    ],
)
def test_out_that_is_a_file_is_refused_before_any_work(prog, args, tmp_path):
    """`--out=<an existing file>`: one line, exit 78, and the file and its folder exactly as they were."""
    target = tmp_path / "taken"
    target.write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", f"launch.{prog}", *args, f"--out={target}"],
        cwd=REPO,
        env=env_for(None),
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert proc.returncode == 78, proc.stderr[-1500:]
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: --out={target} is an existing file"), errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and target.read_text() == "mine"
