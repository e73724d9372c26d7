"""`launch.reshard --to_hf` writes a folder that transformers uses on its own: AutoTokenizer (the byte tokenizer as
a `tokenizers` JSON) + AutoModelForCausalLM (with its generation config) generate what `launch.generate` does."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import jax
import pytest

from tests.tools import REPO
from tests.tools.checkpoint_helpers import random_state, tiny_mesh_config
from zaya_jax.checkpoint import Checkpointer
from zaya_jax.data.tokenizer import ByteTokenizer
from zaya_jax.hf.skip_usage import logged_skip_use, skip_slot_warning
from zaya_jax.hf.tokenizer_files import byte_chars, byte_tokenizer
from zaya_jax.parallel.mesh import make_mesh

PROMPT = "def main():\n    print("
NEW = 24


def test_byte_tokenizer_json_matches_the_byte_tokenizer():
    from tokenizers import pre_tokenizers

    assert sorted(byte_chars()) == sorted(pre_tokenizers.ByteLevel.alphabet())  # the standard byte alphabet
    ours, theirs = ByteTokenizer(), byte_tokenizer()
    text = "héllo wörld\n\t  日本語 \x00\x7f ~!<s></s>"
    assert theirs.encode(text).ids == ours.encode(text)
    assert theirs.decode(ours.encode(text)) == text
    specials = "<|begin_of_text|>a<|endoftext|><|pad|>"
    assert theirs.encode(specials).ids == [ours.bos_id, ord("a") + ours.offset, ours.eos_id, ours.pad_id]


def _random_checkpoint(path: str) -> None:
    config = tiny_mesh_config(dict(data=8, expert=1, context=1))
    _, state = random_state(config, make_mesh(config), seed=3)
    # transformers 5.24's from_pretrained sets every layer's skip-slot balancing bias to -1 after loading (its
    # _init_weights); a trained run's skip bias differs, and then only the project's loaders (launch.generate,
    # zaya_jax.hf.load_pretrained) reproduce the model exactly. Give the random model that value.
    biases = jax.tree.map(lambda b: b.at[..., -1].set(-1.0), state.biases)
    state = state._replace(biases=biases)
    ck = Checkpointer(path, async_save=False)
    ck.save(5, state, {"data": None, "config": config.to_dict()}, wait=True)
    ck.close()


@pytest.mark.slow
def test_exported_folder_generates_like_launch_generate(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    src, hf_dir = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    _random_checkpoint(src)
    env = dict(os.environ, PYTHONPATH=REPO)
    subprocess.run(
        [sys.executable, "-m", "launch.reshard", f"--src={src}", f"--to_hf={hf_dir}"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    files = set(os.listdir(hf_dir))
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= files, files
    for name in files:  # readable by group and others, as files written with the usual umask
        assert stat.S_IMODE(os.stat(os.path.join(hf_dir, name)).st_mode) & 0o044 == 0o044, name

    ours = subprocess.run(
        [sys.executable, "-m", "launch.generate", f"--hf={hf_dir}", f"--prompt={PROMPT}", f"--max_new_tokens={NEW}"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    ours_text = ours.split("\n", 1)[1].rstrip("\n")  # after the "=== 'prompt'" header line

    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    inputs = tok(PROMPT, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == ByteTokenizer().encode(PROMPT)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW)  # greedy and eos from generation_config.json
    new_ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(set(new_ids)) > 3, "a degenerate continuation makes a weak test"
    assert PROMPT + ByteTokenizer().decode(new_ids) == ours_text
    assert tok.decode(out[0], skip_special_tokens=True) == ours_text


# ---------------- an HF-layout export warns about the skip slot only when the run used it, and says how much
# (zaya_jax/hf/skip_usage.py, launch.reshard --to_hf).


def _metrics(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "skip_fr')  # a torn last line
    return str(path)


def test_an_unused_skip_slot_gives_no_warning(tmp_path):
    path = _metrics(tmp_path, [{"step": 10, "loss": 2.0, "skip_fraction": [0.0, 0.0]}, {"step": 20, "eval_loss": 1.9}])
    use = logged_skip_use(path)
    assert use == {"step": 10, "max": 0.0, "mean": 0.0}
    assert skip_slot_warning("scaled_input", use) is None


def test_a_used_skip_slot_is_reported_with_its_share_at_the_exported_step(tmp_path):
    rows = [
        {"step": 10, "skip_fraction": [0.03, 0.01]},
        {"step": 20, "skip_fraction": [0.0, 0.0]},  # after the exported step: not what step 10 learnt
    ]
    use = logged_skip_use(_metrics(tmp_path, rows), step=10)
    assert use["step"] == 10 and abs(use["max"] - 0.03) < 1e-12 and abs(use["mean"] - 0.02) < 1e-12
    message = skip_slot_warning("scaled_input", use)
    assert "up to 3.00% of a layer's tokens (mean 2.00% over layers, logged at step 10)" in message
    assert "\n" not in message


def test_without_the_run_metrics_the_warning_says_it_cannot_tell(tmp_path):
    assert logged_skip_use(str(tmp_path / "missing.jsonl")) is None
    assert "is unknown" in skip_slot_warning("scaled_input", None)
    assert skip_slot_warning("zero", None) is None  # HF-native semantics: identical outputs
