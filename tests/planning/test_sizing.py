"""MI300X sizing rules (docs/sizing.md) and the check_sizing CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from tests.tools import REPO
from zaya_jax import hardware
from zaya_jax.config import load_config, model_config
from zaya_jax.planning import sizing

BAD_CONFIG = """
from zaya_jax.config import default_config


def get_config(arg=None):
    config = default_config()
    config.model.head_dim = 96
    config.model.vocab_size = 50257
    return config
"""


def _bad_model():
    m = model_config()
    m.head_dim = 96
    m.vocab_size = 50257
    return m


def test_zaya1_base_is_clean():
    config = load_config(os.path.join(REPO, "experiments", "zaya1_base.py"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sizing warning would fail here
        assert sizing.warn_model(config) == []
    for hw in hardware.HARDWARE:
        assert sizing.check_model(config.model, hw) == []
        assert sizing.check_model(config, hw) == []
    assert sizing.propose(config.model) == {}
    assert sizing.check_model(config.model, strict=True) == []


def test_head_dim_96_and_gpt2_vocab_flagged():
    violations = sizing.check_model(_bad_model())
    assert len(violations) == 2
    head, vocab = violations
    assert "head_dim=96" in head and "64 or 128" in head and "rule" in head
    assert "vocab_size=50257" in vocab and "50304" in vocab and "nearest compliant" in vocab
    assert sizing.propose(_bad_model()) == {"head_dim": 128, "vocab_size": 50304}


def test_loading_a_config_does_not_warn_but_the_sizing_warning_does(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD_CONFIG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(str(path))  # config loading is pure: launch.train warns (sizing.warn_model)
        assert not [w for w in caught if str(w.message).startswith("sizing:")]
        sizing.warn_model(config)
    messages = [str(w.message) for w in caught if str(w.message).startswith("sizing:")]
    assert len(messages) == 2
    assert "head_dim=96" in messages[0] and "vocab_size=50257" in messages[1]
    small = model_config()
    small.hidden_size, small.head_dim = 256, 96  # below SIZING_MIN_HIDDEN: a CPU / debugging size, no warning
    assert sizing.warn_model(small) == []


def test_mfu_peak_from_the_hardware_table():
    assert hardware.peak_flops("AMD Instinct MI300X", "bfloat16") == pytest.approx(1307.4e12)
    assert hardware.peak_flops("AMD Instinct MI300X", "float32") == pytest.approx(163.4e12)
    assert hardware.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == pytest.approx(989.4e12)
    assert hardware.hardware_for_device("NVIDIA H200").name == "H200"
    assert hardware.peak_flops("cpu", "float32") is None  # no table entry: MFU needs a measured peak


def test_strict_and_derived_rules():
    m = model_config()
    m.hidden_size = 1920  # 15 * 128: fine
    m.router_hidden_size = 192  # multiple of 64 only
    assert sizing.check_model(m) == []
    strict = sizing.check_model(m, strict=True)
    assert len(strict) == 1 and "router_hidden_size=192" in strict[0]
    assert sizing.propose(m, strict=True) == {"router_hidden_size": 256}
    m = model_config()
    m.hidden_size = 2000
    assert sizing.propose(m) == {"hidden_size": 2048}


def test_expert_intensity_rule():
    mi300x = hardware.get_hardware("MI300X")
    assert mi300x.ridge == pytest.approx(246.7, abs=0.5)
    te = sizing.min_tokens_for_ridge(2048, 4096, mi300x.ridge)
    assert 295 < te < 310  # docs/sizing.md rule 5: "near T_e ~ 300"
    assert sizing.expert_intensity(te, 2048, 4096) == pytest.approx(mi300x.ridge)
    m = model_config()
    assert sizing.check_model(m, tokens_per_device=8192) == []
    low = sizing.check_model(m, tokens_per_device=4096)  # 256 tokens per expert < 302
    assert len(low) == 1 and "routed tokens per expert" in low[0]
    assert sizing.propose(m, tokens_per_device=4096) == {"tokens_per_device": 4864}
    narrow = model_config()
    narrow.moe_intermediate_size = 128  # gate/up ceiling 2048*256/2304 = 228 FLOP/B < 247
    flagged = sizing.check_model(narrow)
    assert len(flagged) == 1 and "memory-bound" in flagged[0]
    assert sizing.propose(narrow)["moe_intermediate_size"] % 128 == 0


def test_mesh_divisibility_rule():
    m = model_config()
    assert sizing.check_model(m, mesh={"expert": 8}) == []
    out = sizing.check_model(m, mesh={"expert": 3})
    assert len(out) == 1 and "num_experts=16" in out[0] and "15 or 18" in out[0]


def test_hardware_table():
    assert set(hardware.HARDWARE) == {"mi300x", "mi325x", "mi355x", "h100", "h200"}
    h = hardware.get_hardware("h100")
    assert h.peak_bf16_flops == pytest.approx(989.4e12) and "peak_bf16_flops" in h.vendor_spec
    assert hardware.get_hardware("MI300X").memory_bytes == pytest.approx(192e9)
    with pytest.raises(ValueError, match="unknown hardware 'a100'.*mi300x"):
        hardware.get_hardware("a100")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.check_sizing", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_check_sizing_cli(tmp_path):
    ok = _cli("--config=experiments/zaya1_base.py")
    assert ok.returncode == 0, ok.stderr
    assert "no sizing violations" in ok.stdout and "MI300X" in ok.stdout
    path = tmp_path / "bad.py"
    path.write_text(BAD_CONFIG)
    bad = _cli(f"--config={path}", "--hardware=mi300x")
    assert bad.returncode == 0, bad.stderr
    assert "2 sizing violation(s)" in bad.stdout
    assert "head_dim: 96 -> 128" in bad.stdout and "vocab_size: 50257 -> 50304" in bad.stdout
    missing = _cli(f"--config={tmp_path / 'missing.py'}")
    assert missing.returncode == 78 and "does not exist" in missing.stderr.strip().splitlines()[-1]
    meshed = _cli("--config=experiments/zaya1_base.py", "--mesh=data:8,expert:3")  # the launchers' mesh syntax
    assert meshed.returncode == 0 and "sharded over mesh axis 'expert' of size 3" in meshed.stdout, meshed.stderr
    assert _cli("--config=experiments/zaya1_base.py", "--mesh=data=8").returncode == 78
