"""Experiment configs: the ZAYA1-base architecture and its three training phases load, validate and
carry the recipe facts the paper states (arXiv 2511.17127)."""

from __future__ import annotations

import math
import os

import pytest
from absl import flags
from ml_collections import config_flags

from tests.tools import REPO
from zaya_jax.config import ConfigError, default_config, load_config, validate
from zaya_jax.train import schedule

BASE = os.path.join(REPO, "experiments", "zaya1_base.py")
PHASES = ("phase1", "phase2", "phase3")
# The paper's "8.3B total": 8,303,355,728 non-embedding parameters, added up by hand from the layer shapes
# (docs/architecture.md §10), not by our model code.
SPEC_NON_EMBEDDING_PARAMS = 8_303_355_728
CLUSTER_GPUS = 1024  # 128 nodes × 8 MI300X


def phase(name: str):
    return load_config(f"{BASE}:{name}")


def test_base_without_argument_is_the_released_architecture():
    from zaya_jax.model.params import param_counts

    config = load_config(BASE)
    assert config.train.seq_len == 4096 and config.model.rope_theta == 1e6
    assert not config.data.sources  # no phase: the default corpus, as before
    assert param_counts(config.model)["non_embedding"] == SPEC_NON_EMBEDDING_PARAMS


@pytest.mark.parametrize("name", PHASES)
def test_phase_loads_validates_and_is_consistent(name):
    config = phase(name)  # load_config runs validate()
    m, t, d = config.model, config.train, config.data
    base = load_config(BASE).model
    for field in ("vocab_size", "hidden_size", "num_layers", "num_experts", "moe_intermediate_size"):
        assert m[field] == base[field], field  # the phases train one architecture
    assert len(d.sources) == len(d.weights) >= 2 and len(set(d.sources)) == len(d.sources)
    assert math.isclose(sum(d.weights), 1.0, abs_tol=1e-12) and min(d.weights) > 0
    assert t.seq_len <= m.max_position_embeddings
    # every batch of the ramp divides over the data-parallel ranks left after context parallelism
    schedule.validate_batch_ramp(t, CLUSTER_GPUS // config.mesh.context)
    tokens = schedule.samples_before(t.steps, t) * t.seq_len
    assert 1e12 <= tokens <= 11e12  # trillions per phase; 12–14T in total
    lr = schedule.learning_rate_schedules(config)
    warm = int(config.optimizer.warmup_steps)
    for key, peak in (("muon", config.optimizer.learning_rate), ("adam", config.optimizer.adam_learning_rate)):
        assert float(lr[key](0)) == 0.0 and math.isclose(float(lr[key](warm)), peak, rel_tol=1e-5)


def test_phase_specific_facts():
    p1, p2, p3 = (phase(n) for n in PHASES)
    assert p1.train.seq_len == p2.train.seq_len == 4096  # 4k in phases 1–2 [P]
    assert p3.train.seq_len == 32_768 and p3.model.max_position_embeddings >= 32_768  # 4k → 32k [P]
    assert p3.model.rope_theta != p1.model.rope_theta == p2.model.rope_theta  # θ changes with the context
    assert p3.model.rope_theta == 1e6  # the released ZAYA1-base value (architecture spec §13.2)
    assert p3.mesh.context > 1  # context-parallel CCA for 32k [Z]
    assert p1.train.batch_ramp and schedule.ramp_boundaries(p1.train)  # batch increased progressively [S]
    sizes = [schedule.batch_size_at(s, p1.train) for s in (0, *schedule.ramp_boundaries(p1.train))]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    total = sum(schedule.samples_before(c.train.steps, c.train) * c.train.seq_len for c in (p1, p2, p3))
    assert 12e12 <= total <= 14.1e12  # "12T" / "14T tokens total" [Z][S]

    def share(config, names):
        return sum(w for s, w in zip(config.data.sources, config.data.weights) if os.path.basename(s) in names)

    stem = {"code", "math", "stem", "structured"}
    assert share(p1, {"web"}) > 0.5 > share(p2, {"web"})  # web-heavy first, then the STEM shift [Z]
    assert share(p2, stem) > share(p1, stem)
    assert share(p3, {"long", "reasoning"}) > 0  # long-context + reasoning mid-training [Z]


def test_unknown_phase_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown phase 'phase4'.*phase1"):
        load_config(f"{BASE}:phase4")


def test_config_flag_selects_phase_and_accepts_overrides():
    argv = ["prog", f"--config={BASE}:phase3", "--config.train.steps=7"]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    assert values.config.train.seq_len == 32_768 and values.config.train.steps == 7


def test_data_root_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ZAYA_DATA_ROOT", "/scratch/zaya")
    assert all(s.startswith("/scratch/zaya/") for s in phase("phase2").data.sources)


# ----------------------------------------------------------------------------- experiments/zaya1.py variants

ZAYA1 = os.path.join(REPO, "experiments", "zaya1.py")
WRAPPERS = {
    "tiny": "zaya1_tiny.py",
    "demo": "zaya1_demo.py",
    "100m": "zaya1_100m.py",
    "h1024": "zaya1_h1024.py",
    "base": "zaya1_base.py",
    "phase1": "zaya1_base.py:phase1",
    "phase2": "zaya1_base.py:phase2",
    "phase3": "zaya1_base.py:phase3",
}


@pytest.mark.parametrize("variant", WRAPPERS)
def test_each_preset_file_is_its_variant(variant):
    wrapper = load_config(os.path.join(REPO, "experiments", WRAPPERS[variant]))
    assert wrapper.to_dict() == load_config(f"{ZAYA1}:{variant}").to_dict()


def test_presets_differ_and_share_one_default_tree():
    configs = {name: load_config(f"{ZAYA1}:{name}") for name in ("tiny", "demo", "100m", "h1024", "base")}
    assert len({c.model.hidden_size for c in configs.values()}) == len(configs)
    assert configs["demo"].mesh.expert == 4 and configs["demo"].model.dispatch == "ep"
    assert configs["tiny"].model.vocab_size == configs["demo"].model.vocab_size == 384  # byte-level tokens
    # base keeps the released architecture: the default model section up to dtype / remat
    base = configs["base"].model.to_dict()
    assert {k for k, v in default_config().model.to_dict().items() if base[k] != v} == {"dtype", "remat"}


def test_every_variant_names_every_geometry_field():
    from zaya_jax.config import GEOMETRY_FIELDS, config_module

    zaya1 = config_module(ZAYA1)
    assert zaya1.Geometry._fields == (*GEOMETRY_FIELDS, "max_position_embeddings")
    for name, geometry in zaya1.GEOMETRY.items():
        assert load_config(f"{ZAYA1}:{name}").model.hidden_size == geometry.hidden_size
    with pytest.raises(TypeError, match="num_layers"):  # a variant cannot leave a size out
        zaya1.Geometry(**{f: 1 for f in zaya1.Geometry._fields if f != "num_layers"})


def test_variant_extras_override_fields():
    config = load_config(f"{ZAYA1}:tiny,train.steps=5,model.dispatch=ep,optimizer.warmup_steps=2")
    assert (config.train.steps, config.model.dispatch, config.optimizer.warmup_steps) == (5, "ep", 2)
    assert load_config(os.path.join(REPO, "experiments", "zaya1_tiny.py:train.steps=70")).train.steps == 70
    with pytest.raises(ConfigError, match="unknown variant 'huge'.*tiny"):
        load_config(f"{ZAYA1}:huge")
    with pytest.raises(ConfigError, match=r"extra 'train\.stepz=5'"):
        load_config(f"{ZAYA1}:tiny,train.stepz=5")


# ----------------------------------------------------------------------------- the config layer


def test_config_package_imports_nothing_else_of_zaya_jax():  # but the error base class
    import subprocess
    import sys

    code = (
        "import sys, zaya_jax.config as c; c.validate(c.default_config()); "
        "print(sorted(m for m in sys.modules if m.startswith('zaya_jax') and not m.startswith('zaya_jax.config')"
        " and m not in ('zaya_jax', 'zaya_jax.errors')), 'jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "False"]


@pytest.mark.parametrize(
    "section, field, value, match",
    [
        ("checkpoint", "keep", 0, "checkpoint.keep=0 must be >= 1"),
        ("balancing", "error_shape", "cube", "balancing.error_shape='cube'; choose one of"),
        ("optimizer", "wsd_decay_shape", "cubic", "optimizer.wsd_decay_shape='cubic'"),
        ("optimizer", "warmup_steps", -1, r"optimizer.warmup_steps=-1 must be >= 0"),
        ("train", "grad_reduce_dtype", "float16", "train.grad_reduce_dtype='float16'"),
        ("train", "peak_tflops", -1.0, "train.peak_tflops"),
        ("data", "eval_fraction", 1.0, "data.eval_fraction"),
        ("mesh", "context_layout", "striped", "mesh.context_layout='striped'"),
        ("model", "remat", "some", "model.remat='some'"),
    ],
)
def test_one_validate_checks_every_section_and_changes_nothing(section, field, value, match):
    from zaya_jax.config import validate

    config = default_config()
    before = config.to_dict()
    assert validate(config) is config and config.to_dict() == before
    config[section][field] = value
    with pytest.raises(ConfigError, match=match) as err:
        validate(config)
    assert "\n" not in str(err.value)


def test_mfu_peak_comes_from_the_config_or_the_table_never_a_benchmark():
    import jax

    from zaya_jax.train.loop import mesh_peak_flops

    config = default_config()
    assert jax.default_backend() == "cpu" and mesh_peak_flops(config) is None  # CPU: no table entry, no peak
    config.train.peak_tflops = 0.5  # measured with launch.bench --suite=gemm; emulated devices share the host
    assert mesh_peak_flops(config) == pytest.approx(0.5e12 * jax.process_count())


def test_experiment_configs_resolve_outside_a_checkout(tmp_path, monkeypatch):
    """`--config=experiments/NAME.py[:arg]` from any directory finds the shipped config (installed as
    zaya_jax/experiments, or the checkout's experiments/ for an editable install)."""
    from zaya_jax.config import load_config, resolve_config_path

    monkeypatch.chdir(tmp_path)
    resolved = resolve_config_path("experiments/zaya1_tiny.py:x")
    path, _, arg = resolved.rpartition(":")
    assert os.path.isfile(path) and path.endswith(os.path.join("experiments", "zaya1_tiny.py")) and arg == "x"
    assert load_config("experiments/zaya1_tiny.py").model.hidden_size == 64
    assert resolve_config_path("experiments/missing.py") == "experiments/missing.py"  # reported as missing later
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "zaya1_tiny.py").write_text("raise SystemExit('the local file wins')\n")
    assert resolve_config_path("experiments/zaya1_tiny.py") == "experiments/zaya1_tiny.py"


# ---------------- every number of a config is finite and in range before anything is compiled (config/numeric.py)

CASES = [
    ("optimizer", "learning_rate", -1.0, "optimizer.learning_rate=-1.0 must be >= 0"),
    ("optimizer", "learning_rate", float("nan"), "optimizer.learning_rate=nan must be a finite number"),
    ("optimizer", "adam_learning_rate", float("inf"), "optimizer.adam_learning_rate=inf must be a finite number"),
    ("optimizer", "adam_b2", 1.0, "optimizer.adam_b2=1.0 must be in [0, 1)"),
    ("optimizer", "adam_eps", 0.0, "optimizer.adam_eps=0.0 must be > 0"),
    ("optimizer", "weight_decay", -0.1, "optimizer.weight_decay=-0.1 must be >= 0"),
    ("optimizer", "grad_clip_norm", -1.0, "optimizer.grad_clip_norm=-1.0 must be >= 0"),
    ("optimizer", "min_lr_ratio", 1.5, "optimizer.min_lr_ratio=1.5 must be in [0, 1]"),
    ("model", "initializer_range", float("nan"), "model.initializer_range=nan must be a finite number"),
    ("model", "rope_theta", float("inf"), "model.rope_theta=inf must be a finite number"),
    ("train", "z_loss", -1e-4, "train.z_loss=-0.0001 must be >= 0"),
    ("train", "peak_tflops", float("nan"), "train.peak_tflops=nan must be a finite number"),
    ("balancing", "kp", float("nan"), "balancing.kp=nan must be a finite number"),
    ("balancing", "warn_dropped", 2.0, "balancing.warn_dropped=2.0 must be in [0, 1]"),
    ("data", "weights", (1.0, float("nan")), "data.weights=nan must be a finite number"),
]


@pytest.mark.parametrize("section, field, value, message", CASES, ids=[f"{c[0]}.{c[1]}={c[2]}" for c in CASES])
def test_a_bad_number_is_one_line_naming_the_field(section, field, value, message):
    config = default_config()
    config[section][field] = value
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert str(err.value) == message


def test_the_defaults_and_zero_learning_rates_pass():
    config = default_config()
    config.optimizer.learning_rate = config.optimizer.adam_learning_rate = 0.0  # frozen weights: allowed
    validate(config)


def test_overlap_collectives_without_its_backward_pass_is_refused():
    """`train.overlap_collectives` acts inside the ZeRO-1 step's fused backward (remat=full): elsewhere it did
    nothing, silently; now it is refused in one line naming both settings."""
    from zaya_jax.config import validate

    config = default_config()
    config.train.overlap_collectives, config.train.param_sharding, config.model.remat = True, "zero1", "full"
    validate(config)
    for remat, sharding in (("none", "zero1"), ("full", "fsdp")):
        config.model.remat, config.train.param_sharding = remat, sharding
        with pytest.raises(ConfigError, match="overlap_collectives=True .* model.remat='full'") as err:
            validate(config)
        assert f"(here {remat!r}, {sharding!r})" in str(err.value) and "\n" not in str(err.value)
