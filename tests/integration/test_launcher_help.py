"""`--help` of a launcher lists the flags it takes from shared modules (launch/model_flags.py, --verbose),
not only its own module's (absl shows other modules' flags under --helpfull only)."""

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
