"""`launch.eval` on a trained checkpoint: bits per byte on held-out data fall below the step-0 checkpoint's
(issue: long context and inference, evaluation). Trains the tiny config for a few dozen steps in a subprocess,
with `checkpoint.save_initial` so the untrained model is kept as the baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tools.checkpoint_helpers import REPO, env_for, run, train_cmd

STEPS = 30


def _eval(checkpoint: str, data: str) -> dict:
    cmd = [sys.executable, "-m", "launch.eval", f"--checkpoint={checkpoint}", f"--data={data}", "--batch_size=8"]
    proc = subprocess.run(cmd, cwd=REPO, env=env_for(1), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])["data"]


@pytest.mark.slow
def test_trained_checkpoint_has_lower_bits_per_byte_than_step0(tmp_path):
    from zaya_jax.data import corpus

    cache = str(tmp_path / "data")
    data = corpus.default_corpus_dir(cache, 32, "byte", 200_000)
    corpus.prepare_default_corpus(data, 32, "byte", 200_000, eval_fraction=0.05, progress=False)
    workdir = str(tmp_path / "run")
    run(
        train_cmd(
            workdir,
            cache,
            8,
            f"--config.train.steps={STEPS}",
            "--config.data.eval_fraction=0.05",
            "--config.checkpoint.save_initial=True",
            f"--config.checkpoint.every={STEPS}",
            "--config.optimizer.learning_rate=0.02",
            "--config.optimizer.adam_learning_rate=0.01",
        ),
        8,
    )
    ckpts = os.path.join(workdir, "checkpoints")
    assert sorted(int(s) for s in os.listdir(ckpts) if s.isdigit()) == [0, STEPS]
    before, after = _eval(os.path.join(ckpts, "0"), data), _eval(os.path.join(ckpts, str(STEPS)), data)
    assert before["tokens"] == after["tokens"] > 0
    assert after["bits_per_byte"] < before["bits_per_byte"] - 0.1, (before, after)
