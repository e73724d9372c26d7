"""Parity of the JAX ZAYA1 model with the Hugging Face reference (`transformers` 5.24 `ZayaForCausalLM`)
through `zaya_jax.hf`: logits and gradients in fp32, export/import round trips, error messages, counts.

Random HF models get every constant-initialised tensor randomised (key temperatures, residual scales and
biases, norms, conv biases, EDA scales, balancing biases) so that a wrong mapping cannot hide behind a
constant, and router weights large enough that routing varies across experts and reaches the skip slot.
Token ids are ≥ 1 in gradient tests: torch's `nn.Embedding(padding_idx=0)` blocks the gradient of row 0.
Spec: docs/architecture.md §7, §10, §11, §14.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

pytestmark = pytest.mark.reference  # needs the `reference` extra (torch, transformers)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.tools import REPO  # noqa: E402
from zaya_jax import hf  # noqa: E402
from zaya_jax.model import abstract_model  # noqa: E402
from zaya_jax.model.params import param_counts  # noqa: E402

TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# name -> (ZayaConfig kwargs, sequence lengths checked; the last one also for gradients)
CONFIGS = {
    "tiny_spec14": (
        dict(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts=4,
            router_hidden_size=16,
            max_position_embeddings=128,
        ),
        (33,),
    ),
    "odd_h48_gqa3": (
        dict(
            vocab_size=96,
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=8,
            moe_intermediate_size=24,
            num_experts=2,
            router_hidden_size=8,
            max_position_embeddings=64,
            rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}},
        ),
        (1, 7),
    ),
    "odd_h80_d24": (
        dict(
            vocab_size=128,
            hidden_size=80,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            moe_intermediate_size=40,
            num_experts=3,
            router_hidden_size=24,
            max_position_embeddings=64,
            cca_time0=3,
            rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}},
        ),
        (33,),
    ),
}
REL_TOL = 1e-5
# per-tensor gradient error vs the tensor's largest |gradient|: the scalar gradients (attention temperatures)
# sum B·S·heads terms with cancellation, and fp32 reduction orders differ between CPU kernels (1.2e-5 on AMD
# EPYC for one spec, ≤ 5e-6 for the rest)
GRAD_REL_TOL = 3e-5


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def randomise_hf(model, seed: int) -> None:
    """Randomise the tensors HF initialises to constants; make routing vary and reach the skip slot."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda p, std, mean=0.0: p.copy_(mean + std * torch.randn(p.shape, generator=g))  # noqa: E731
    r = model.config.router_hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("qk_norm.temp"):
                p.copy_(0.5 + 2.0 * torch.rand(p.shape, generator=g))
            elif re.search(r"(norm\.weight|_scale)$", name):
                rnd(p, 0.2, 1.0)
            elif re.search(r"(\.bias|_bias)$", name):
                rnd(p, 0.1)
            elif re.search(r"router_mlp\.(fc1|fc2|out_proj)\.weight$", name):
                rnd(p, 2.0 / r**0.5)
        for name, b in model.named_buffers():
            if name.endswith("balancing_biases"):
                rnd(b, 0.02)
                b[-1] += 0.08  # skip slot: reachable for some tokens, not all


def build_hf(name: str, seed: int = 0):
    kwargs, _ = CONFIGS[name]
    torch.manual_seed(seed)
    config = transformers.ZayaConfig(**kwargs, **TOKENS, initializer_range=0.05)
    model = transformers.ZayaForCausalLM(config).float().eval()
    randomise_hf(model, seed + 1)
    return model


def token_ids(vocab: int, batch: int, seq: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, vocab, size=(batch, seq), dtype=np.int64)  # ids >= 1


def torch_ce(logits, ids):
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))


def jax_ce(logits: jax.Array, ids: jax.Array) -> jax.Array:
    """Mean token cross-entropy with shifted labels, written independently of the training loss."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))


def jax_loss_grad(model):
    """One jitted fn over the params: (loss, (logits, MoE stats)), d loss / d params."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, ids):
        out = nnx.merge(graphdef, p, rest).forward(ids)
        return jax_ce(out.logits, ids), out

    return params, jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.fixture(scope="module", params=list(CONFIGS))
def run(request, tmp_path_factory):
    """Build a random HF model, save it, load it with `zaya_jax.hf`, and run both sides.

    Returns a dict: name, config (JAX), hf_model, model, per-seq-length (ref, out) logits and MoE stats,
    torch and JAX losses / gradients at the longest sequence length.
    """
    name = request.param
    hf_model = build_hf(name)
    path = str(tmp_path_factory.mktemp(name))
    hf_model.save_pretrained(path)
    config, model = hf.load_pretrained(path)
    params, loss_grad = jax_loss_grad(model)
    forward = nnx.jit(lambda mdl, x: mdl(x))
    norms, logits = [], {}
    hooks = [
        mod.register_forward_pre_hook(lambda _, args: norms.extend(a.norm(dim=-1).min().item() for a in args))
        for mod in hf_model.modules()
        if isinstance(mod, transformers.models.zaya.modeling_zaya.ZayaQKNorm)
    ]
    *short, longest = CONFIGS[name][1]
    for seq in short:
        ids = token_ids(config.model.vocab_size, 2, seq, seed=seq)
        with torch.no_grad():
            ref = hf_model(torch.from_numpy(ids)).logits.numpy()
        logits[seq] = (ref, np.asarray(forward(model, jnp.asarray(ids))))
    ids = token_ids(config.model.vocab_size, 2, longest, seed=longest)
    hf_model.zero_grad()
    ref_out = hf_model(torch.from_numpy(ids))
    loss_ref = torch_ce(ref_out.logits, torch.from_numpy(ids))
    loss_ref.backward()
    for h in hooks:
        h.remove()
    (loss, out), grads = loss_grad(params, jnp.asarray(ids))
    logits[longest] = (ref_out.logits.detach().numpy(), np.asarray(out.logits))
    torch_grads = {n: p.grad.numpy() for n, p in hf_model.named_parameters()}  # embed grad includes the tied head
    return dict(
        name=name,
        config=config,
        hf_model=hf_model,
        model=model,
        logits=logits,
        norms=norms,
        counts=np.asarray(out.stats.counts),
        loss=(loss_ref.item(), float(loss)),
        torch_grads=torch_grads,
        grads={p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(grads)},
    )


def test_logits_and_skip_slot(run):
    m = run["config"].model
    assert m.skip_output == "zero" and m.dispatch == "dropless"
    for seq, (ref, out) in run["logits"].items():
        err = rel_err(out, ref)
        print(f"{run['name']} S={seq}: logits rel err {err:.2e}")
        assert err <= REL_TOL, (run["name"], seq, err)
    # HF in fp32 floors ‖q‖, ‖k‖ at float32 eps, the JAX model at qk_norm_eps = 2^-7: never reached here.
    assert min(run["norms"]) > 8 * m.qk_norm_eps
    counts = run["counts"]  # [L, E+1] router choices at the longest sequence
    assert counts[:, m.num_experts].sum() > 0, f"skip slot never chosen: {counts}"
    assert counts[:, m.num_experts].sum() < counts.sum(), counts
    assert all((row > 0).sum() >= 2 for row in counts), f"routing does not vary: {counts}"


def test_gradients_match_torch(run):
    m, flat = run["config"].model, run["grads"]
    loss_ref, loss = run["loss"]
    assert abs(loss - loss_ref) <= 1e-5 * abs(loss_ref)
    tensors = dict(run["torch_grads"])
    tensors.update((n, b.numpy()) for n, b in run["hf_model"].named_buffers() if n.endswith("balancing_biases"))
    shapes = {p: a.shape for p, a in flat.items()}
    shapes[("layers", "moe", "router", "balancing_bias")] = (m.num_layers, m.num_experts + 1)
    ref = hf.hf_to_state(hf.tensor_specs(m, shapes, "hf"), tensors.__getitem__, shapes, {p: np.float32 for p in shapes})
    worst = 0.0
    for path, g in flat.items():
        r = ref[path]
        if path == ("layers", "moe", "router", "eda_scale"):
            g, r = g[1:], r[1:]  # layer 0's EDA scale is dead (HF has none)
        scale = np.max(np.abs(r))
        assert scale > 0, f"zero reference gradient for {path}"
        err = np.max(np.abs(g - r))
        worst = max(worst, err / scale)
        assert err <= GRAD_REL_TOL * scale + 1e-10, (path, err, scale)
    print(f"{run['name']}: worst per-tensor gradient rel err {worst:.2e}")


def random_jax_model(m, seed: int):
    """A JAX-native model with every variable random (weights, scales, biases, norms, temps, β)."""
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(abstract_model(m))
    flat = nnx.to_flat_state(state)
    for path, var in flat:
        shape, leaf = var.get_value().shape, path[-1]
        if leaf in ("scale", "h_scale", "r_scale", "in_scale", "eda_scale", "norm", "temp"):
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif leaf == "balancing_bias":
            value = 0.02 * rng.standard_normal(shape) + np.eye(shape[-1])[-1] * 0.08
        elif leaf.endswith("bias") or leaf in ("b1", "b2", "b_down", "conv1_b", "conv2_b"):
            value = 0.05 * rng.standard_normal(shape)
        else:
            std = 2.0 / np.sqrt(m.router_hidden_size) if leaf in ("w1", "w2", "w3") else 0.05
            value = std * rng.standard_normal(shape)
        var.set_value(jnp.asarray(value, var.get_value().dtype))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def assert_same_state(model, arrays: dict) -> None:
    """Bit-identical variables, except the dead layer-0 EDA scale (no tensor in either layout; loads as 1)."""
    for p, a in hf.model_arrays(model).items():
        a_ref = arrays[p]
        if p[-1] == "eda_scale":
            np.testing.assert_array_equal(a[0], 1.0)
            a, a_ref = a[1:], a_ref[1:]
        np.testing.assert_array_equal(a, a_ref, err_msg=str(p))


def test_export_roundtrip_hf_and_legacy(tmp_path):
    kwargs, _ = CONFIGS["tiny_spec14"]
    m = hf.config_from_hf({**kwargs, **TOKENS, "rope_parameters": {"rope_theta": 1e4}})  # flat rope form
    assert m.partial_rotary_factor == 1.0 and m.rope_theta == 1e4
    model = random_jax_model(m, seed=3)
    out = tmp_path / "hf"
    hf.save_pretrained(model, str(out))
    with pytest.raises(hf.HFConversionError, match="not empty"):
        hf.save_pretrained(model, str(out))
    hf.save_pretrained(model, str(out), overwrite=True)
    assert transformers.ZayaConfig(**hf.read_hf_config(str(out))).num_hidden_layers == m.num_layers
    ref_model = transformers.ZayaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    written = safetensors.numpy.load_file(str(out / "model.safetensors"))
    loaded = {n: t.numpy() for n, t in ref_model.state_dict().items() if n != "lm_head.weight"}
    assert set(loaded) == set(written)
    for name, t in written.items():
        if name.endswith("balancing_biases"):
            # transformers 5.24 `from_pretrained` re-runs `_init_weights`, whose unguarded
            # `balancing_biases[-1] = -1.0` overwrites the stored skip-slot bias: restore it from the file.
            np.testing.assert_array_equal(loaded[name][:-1], t[:-1], err_msg=name)
            ref_model.get_buffer(name).copy_(torch.from_numpy(t))
        else:
            np.testing.assert_array_equal(loaded[name], t, err_msg=name)
    ids = token_ids(m.vocab_size, 2, 17, seed=5)
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(ids)).logits.numpy()
    res = nnx.jit(lambda mdl, x: mdl.forward(x))(model, jnp.asarray(ids))
    err = rel_err(res.logits, ref)
    print(f"export: JAX vs HF-loaded logits rel err {err:.2e}")
    assert err <= REL_TOL
    assert np.asarray(res.stats.counts)[:, m.num_experts].sum() > 0  # the skip slot is exercised
    arrays = hf.model_arrays(model)
    _, back = hf.load_pretrained(str(out))
    assert_same_state(back, arrays)
    legacy = tmp_path / "legacy"
    hf.save_pretrained(model, str(legacy), layout="legacy")
    with safetensors.safe_open(str(legacy / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
    assert {
        "model.layers.0.res_scale.hidden_states_scale",
        "model.res_scale.residual_bias",
        "model.final_norm.weight",
        "model.layers.3.zaya_block.experts.local_experts.3.linear_fc2.weight",
        "model.layers.2.self_attn.qkv.conv_qk.1.weight",
        "model.layers.3.zaya_block.router.router_states_scale",
        "model.layers.2.res_scale.residual_scale",
    } <= names
    assert "model.layers.1.zaya_block.router.router_states_scale" not in names  # first router has no EDA
    assert max(int(n.split(".")[2]) for n in names if n.startswith("model.layers.")) == 2 * m.num_layers - 1
    _, back = hf.load_pretrained(str(legacy))  # layout auto-detected
    assert_same_state(back, arrays)


def test_sharded_and_bf16_checkpoints(tmp_path):
    hf_model = build_hf("odd_h48_gqa3", seed=11)
    hf_model.save_pretrained(str(tmp_path / "single"))
    hf_model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    assert os.path.exists(tmp_path / "sharded" / "model.safetensors.index.json")
    _, single = hf.load_pretrained(str(tmp_path / "single"))
    _, sharded = hf.load_pretrained(str(tmp_path / "sharded"))
    ref = hf.model_arrays(single)
    assert_same_state(sharded, ref)
    hf.save_pretrained(single, str(tmp_path / "mine"), max_shard_bytes=20_000)  # the exporter's own shards
    assert len(json.loads((tmp_path / "mine" / "model.safetensors.index.json").read_text())["weight_map"]) > 10
    assert_same_state(hf.load_pretrained(str(tmp_path / "mine"))[1], ref)
    hf_model.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    _, bf16 = hf.load_pretrained(str(tmp_path / "bf16"))
    for p, a in hf.model_arrays(bf16).items():
        expect = ref[p].astype(jnp.bfloat16).astype(np.float32)  # HF's .to(bf16) casts the β buffers too
        if p[-1] == "eda_scale":
            a, expect = a[1:], expect[1:]
        np.testing.assert_array_equal(a, expect, err_msg=str(p))
    _, as_bf16 = hf.load_pretrained(str(tmp_path / "single"), dtype="bfloat16")
    assert as_bf16.embed.get_value().dtype == jnp.bfloat16 and as_bf16.cfg.dtype == "bfloat16"


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("good"))
    build_hf("tiny_spec14", seed=21).save_pretrained(path)
    return path


def _variant(good_dir: str, dst, edit_tensors=None, edit_config=None) -> str:
    shutil.copytree(good_dir, dst)
    if edit_tensors:
        file = os.path.join(dst, "model.safetensors")
        tensors = safetensors.numpy.load_file(file)
        edit_tensors(tensors)
        safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})
    if edit_config:
        with open(os.path.join(dst, "config.json")) as f:
            cfg = json.load(f)
        edit_config(cfg)
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f)
    return str(dst)


W_IN = "model.layers.1.mlp.experts.gate_up_proj"


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no_config", r"config\.json"),
        ("no_weights", r"safetensors"),
        ("unknown_tensor", r"model\.layers\.0\.mlp\.gate\.extra_weight"),
        ("missing_tensor", re.escape("model.layers.1.self_attn.qk_norm.temp")),
        ("shape_mismatch", re.escape(W_IN) + r".*\[4, 64, 62\].*\[4, 64, 64\]"),
        ("top2", r"num_experts_per_tok"),
        ("sliding", r"layer_types"),
        ("untied", r"tie_word_embeddings"),
        ("missing_field", r"router_hidden_size"),
        ("untied_head_tensor", r"lm_head\.weight"),
    ],
)
def test_bad_inputs(good_dir, tmp_path, case, expected):
    dst = tmp_path / case
    if case == "no_config":
        path = _variant(good_dir, dst)
        os.remove(os.path.join(path, "config.json"))
    elif case == "no_weights":
        path = _variant(good_dir, dst)
        os.remove(os.path.join(path, "model.safetensors"))
    else:
        edits = {
            "unknown_tensor": dict(
                edit_tensors=lambda t: t.update({"model.layers.0.mlp.gate.extra_weight": np.zeros(3, np.float32)})
            ),
            "missing_tensor": dict(edit_tensors=lambda t: t.pop("model.layers.1.self_attn.qk_norm.temp")),
            "shape_mismatch": dict(edit_tensors=lambda t: t.update({W_IN: t[W_IN][..., :62].copy()})),
            "top2": dict(edit_config=lambda c: c.update(num_experts_per_tok=2)),
            "sliding": dict(edit_config=lambda c: c.update(layer_types=["hybrid", "hybrid_sliding"], sliding_window=8)),
            "untied": dict(edit_config=lambda c: c.update(tie_word_embeddings=False)),
            "missing_field": dict(edit_config=lambda c: c.pop("router_hidden_size")),
            "untied_head_tensor": dict(
                edit_tensors=lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1.0})
            ),
        }[case]
        path = _variant(good_dir, dst, **edits)
    with pytest.raises(hf.HFConversionError, match=expected):
        hf.load_pretrained(path)


def test_param_counts_match_hf():
    for name in CONFIGS:
        hf_model = build_hf(name)
        m = hf.config_from_hf(hf_model.config.to_dict())
        assert param_counts(m)["total"] == sum(p.numel() for p in hf_model.parameters()), name
    # the §14 reference figure for the tiny config
    assert (
        param_counts(
            hf.config_from_hf({**CONFIGS["tiny_spec14"][0], **TOKENS, "rope_parameters": {"rope_theta": 1e4}})
        )["total"]
        == 101_876
    )


def test_count_params_cli_base():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-m", "launch.count_params", "--config=experiments/zaya1_base.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    values = {k: int(v.replace(",", "")) for k, v in re.findall(r"(\w+):\s+([\d,]+)", out)}
    assert values["non_embedding"] == 8_303_355_728  # spec §10 (HF's count)
    assert values["active_non_embedding"] == 753_608_528
    assert values["embedding"] == 537_133_056
