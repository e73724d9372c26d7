"""Optimizer split, per-matrix Muon, weight decay, clipping, LR schedules and the batch ramp."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax.config import ConfigError, default_config
from zaya_jax.model.layers import BalancingBias
from zaya_jax.model.zaya import abstract_model
from zaya_jax.train import optimizer as opt_lib
from zaya_jax.train import schedule as sched

L, E, H, I, R, V = 2, 3, 16, 12, 8, 32
MUON_LR, ADAM_LR = 0.05, 0.01


def tiny_model_config():
    c = default_config()
    c.model.update(
        dict(
            vocab_size=64,
            hidden_size=32,
            num_layers=2,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=8,
            moe_intermediate_size=16,
            num_experts=4,
            router_hidden_size=8,
            max_position_embeddings=64,
        )
    )
    return c


def make_config(**opt):
    c = default_config()
    c.train.steps = 100
    c.optimizer.update(
        dict(
            schedule="constant",
            warmup_steps=0,
            grad_clip_norm=0.0,
            weight_decay=0.0,
            learning_rate=MUON_LR,
            adam_learning_rate=ADAM_LR,
        )
    )
    c.optimizer.update(opt)
    return c


def small_params(seed: int = 0) -> dict:
    """A ZAYA1-named parameter tree with small shapes (no model needed)."""
    shapes = {
        "embed": (V, H),
        "in_scale": (H,),
        "final_norm": {"scale": (H,)},
        "layers": {
            "attn": {
                "wq": (L, H, 8),
                "wo": (L, 8, H),
                "conv1_w": (L, 2, 12),
                "conv1_b": (L, 12),
                "conv2_w": (L, 2, 3, 4, 4),
                "temp": (L, 2),
            },
            "attn_merge": {"h_scale": (L, H)},
            "moe": {
                "router": {"w_down": (L, H, R), "w3": (L, R, E + 1), "b1": (L, R), "eda_scale": (L, R)},
                "w_in": (L, E, H, 2 * I),
                "w_out": (L, E, I, H),
            },
        },
    }
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.standard_normal(s), jnp.float32), shapes, is_leaf=lambda x: isinstance(x, tuple)
    )


def np_newton_schulz(g: np.ndarray, steps: int = 5, eps: float = 1e-7) -> np.ndarray:
    """Independent reference: quintic NS X ← 3.4445X − 4.7750(XXᵀ)X + 2.0315(XXᵀ)²X on one matrix."""
    x = np.asarray(g, np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        a = x @ x.T
        x = 3.4445 * x - 4.7750 * a @ x + 2.0315 * a @ a @ x
    return x.T if tall else x


def first_update(config, params, grads):
    tx = opt_lib.make_optimizer(config, params)
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    return updates, state


# ----------------------------------------------------------------------------- labels


def test_labels_on_model_tree():
    c = tiny_model_config()
    state = nnx.state(abstract_model(c.model), nnx.Param)
    flat = {
        jax.tree_util.keystr(p): v
        for p, v in jax.tree_util.tree_flatten_with_path(opt_lib.param_labels(nnx.to_pure_dict(state)))[0]
    }
    muon = {k for k, v in flat.items() if v == "muon"}
    expect_muon = {f"['layers']['attn']['{n}']" for n in ("wq", "wk", "wv_cur", "wv_del", "wo")}
    expect_muon |= {f"['layers']['moe']['router']['{n}']" for n in ("w_down", "w1", "w2", "w3")}
    expect_muon |= {"['layers']['moe']['w_in']", "['layers']['moe']['w_out']"}
    assert muon == expect_muon
    for k in (
        "['embed']",
        "['in_scale']",
        "['final_norm']['scale']",
        "['layers']['attn']['conv1_w']",
        "['layers']['attn']['conv2_w']",
        "['layers']['attn']['temp']",
        "['layers']['moe']['router']['norm']",
        "['layers']['moe']['router']['eda_scale']",
        "['layers']['attn_merge']['r_bias']",
    ):
        assert flat[k] == "adam", k
    conv = opt_lib.param_labels(nnx.to_pure_dict(state), muon_conv=True)
    assert conv["layers"]["attn"]["conv2_w"] == "muon" and conv["layers"]["attn"]["conv1_w"] == "adam"
    # nnx.State with Variable nodes keeps its structure
    labels = opt_lib.param_labels(state)
    assert jax.tree.structure(labels) == jax.tree.structure(state)


def test_unknown_parameter_raises():
    with pytest.raises(ValueError, match="mystery"):
        opt_lib.param_labels({"layers": {"mystery": jnp.zeros((2, 3))}})


# ----------------------------------------------------------------------------- Muon per matrix


def test_muon_orthogonalises_each_matrix():
    """Split gate/up with consistent-RMS scaling (0.2); fused w_in with width scaling (rms = 0)."""
    params, grads = small_params(0), small_params(1)
    split_up, _ = first_update(make_config(muon_split_gate_up=True, muon_consistent_rms=0.2), params, grads)
    whole_up, _ = first_update(make_config(muon_split_gate_up=False, muon_consistent_rms=0.0), params, grads)

    def scale(fan_in, fan_out, rms=0.2):
        return math.sqrt(max(fan_in, fan_out)) * rms if rms > 0 else math.sqrt(max(1.0, fan_out / fan_in))

    g_in = np.asarray(grads["layers"]["moe"]["w_in"])
    for l_idx in range(L):
        for e in range(E):
            g = g_in[l_idx, e]
            gate, up = np_newton_schulz(g[:, :I]), np_newton_schulz(g[:, I:])
            want = -MUON_LR * scale(H, I) * np.concatenate([gate, up], axis=-1)
            np.testing.assert_allclose(split_up["layers"]["moe"]["w_in"][l_idx, e], want, atol=2e-5, rtol=1e-3)
            want = -MUON_LR * scale(H, 2 * I, rms=0.0) * np_newton_schulz(g)
            np.testing.assert_allclose(whole_up["layers"]["moe"]["w_in"][l_idx, e], want, atol=2e-5, rtol=1e-3)
            g = np.asarray(grads["layers"]["moe"]["w_out"][l_idx, e])
            want = -MUON_LR * scale(I, H) * np_newton_schulz(g)
            np.testing.assert_allclose(split_up["layers"]["moe"]["w_out"][l_idx, e], want, atol=2e-5, rtol=1e-3)
        for get in (lambda t: t["layers"]["attn"]["wq"], lambda t: t["layers"]["moe"]["router"]["w3"]):
            g, u = np.asarray(get(grads)), get(split_up)
            want = -MUON_LR * scale(*g.shape[1:]) * np_newton_schulz(g[l_idx])
            np.testing.assert_allclose(u[l_idx], want, atol=2e-5, rtol=1e-3)
    # the split really is different from orthogonalising the fused [H, 2I] matrix
    assert not np.allclose(split_up["layers"]["moe"]["w_in"], whole_up["layers"]["moe"]["w_in"], atol=1e-3)
    # AdamW leaves: first step = -lr * g / (|g| + eps)
    g = np.asarray(grads["embed"])
    np.testing.assert_allclose(split_up["embed"], -ADAM_LR * g / (np.abs(g) + 1e-8), rtol=1e-4, atol=1e-7)


def test_orthogonalize_gives_near_orthogonal_matrices():
    x = jax.random.normal(jax.random.key(3), (2, 3, 16, 40))
    o = np.asarray(opt_lib.orthogonalize(x))
    s = np.linalg.svd(o, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.3  # the quintic's known band around 1


def test_muon_conv_taps_orthogonalised_per_head_and_tap():
    params, grads = small_params(0), small_params(2)
    up, _ = first_update(make_config(muon_conv=True, muon_consistent_rms=0.0), params, grads)
    g = np.asarray(grads["layers"]["attn"]["conv2_w"])
    for idx in np.ndindex(*g.shape[:3]):
        np.testing.assert_allclose(
            up["layers"]["attn"]["conv2_w"][idx], -MUON_LR * np_newton_schulz(g[idx]), atol=2e-5, rtol=1e-3
        )


# ----------------------------------------------------------------------------- decay, clipping


@pytest.mark.parametrize("decay_embedding", [False, True])
def test_weight_decay_mask(decay_embedding):
    wd = 0.1
    params = small_params(0)
    zeros = jax.tree.map(jnp.zeros_like, params)
    up, _ = first_update(make_config(weight_decay=wd, decay_embedding=decay_embedding), params, zeros)
    labels_flat = {p[-1].key: v for p, v in jax.tree_util.tree_flatten_with_path(opt_lib.param_labels(params))[0]}
    decayed = {"wq", "wo", "w_down", "w3", "w_in", "w_out", "conv1_w", "conv2_w"} | (
        {"embed"} if decay_embedding else set()
    )
    for path, u in jax.tree_util.tree_flatten_with_path(up)[0]:
        name = path[-1].key
        p = params
        for k in path:
            p = p[k.key]
        lr = MUON_LR if labels_flat[name] == "muon" else ADAM_LR
        want = -lr * wd * np.asarray(p) if name in decayed else np.zeros_like(p)
        np.testing.assert_allclose(u, want, rtol=1e-5, atol=1e-8, err_msg=name)


def _momentum_norm(state) -> float:
    mus = [
        s.mu
        for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, "mu") and hasattr(s, "count"))
        if hasattr(s, "mu")
    ]
    return float(optax.tree.norm(mus))


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_global_norm_clipping(clip):
    pick = lambda t: {"embed": t["embed"], "layers": {"moe": {"w_in": t["layers"]["moe"]["w_in"]}}}  # noqa: E731
    params = pick(small_params(0))
    grads = jax.tree.map(lambda g: 100.0 * g, pick(small_params(1)))
    norm = float(optax.tree.norm(grads))
    _, state = first_update(make_config(grad_clip_norm=clip, adam_b1=0.9, muon_momentum=0.9), params, grads)
    want = 0.1 * (min(norm, clip) if clip else norm)  # first moments = (1 - 0.9) * clipped grads
    assert _momentum_norm(state) == pytest.approx(want, rel=1e-4)


class _TinyMoE(nnx.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w_in = nnx.Param(jnp.asarray(rng.standard_normal((L, E, H, 2 * I)), jnp.float32))
        self.balancing_bias = BalancingBias(jnp.zeros((L, E + 1), jnp.float32))


class _TinyModel(nnx.Module):
    """Stand-in with ZAYA1 names (building the real model eagerly is slow on 2 CPU cores)."""

    def __init__(self):
        self.embed = nnx.Param(jnp.ones((V, H), jnp.float32))
        self.final_norm = nnx.Dict(scale=nnx.Param(jnp.ones((H,), jnp.float32)))
        self.moe = _TinyMoE()


def test_nnx_optimizer_smoke():
    model = _TinyModel()
    tx = opt_lib.make_optimizer(make_config(grad_clip_norm=1.0, weight_decay=0.1), nnx.state(model, nnx.Param))
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    grads = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))

    @nnx.jit
    def step(opt, model, grads):
        opt.update(model, grads)

    step(opt, model, grads)
    after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert all(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    np.testing.assert_array_equal(model.moe.balancing_bias[...], 0.0)  # not an nnx.Param: untouched


# ----------------------------------------------------------------------------- per-parameter Muon under GSPMD


@pytest.mark.parametrize("axis", [0, 1])
def test_muon_update_has_no_collectives_when_batch_axis_sharded(axis):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    spec = [None] * 4
    spec[axis] = "data"
    shard = {"w_in": NamedSharding(mesh, P(*spec))}
    params = {"w_in": jnp.zeros((8, 8, 16, 32))}
    tx = opt_lib.scale_by_muon_stacked(split_gate_up=True)
    state_sh = opt_lib.MuonState(NamedSharding(mesh, P()), shard)
    fn = jax.jit(tx.update, in_shardings=(shard, state_sh), out_shardings=(shard, state_sh))
    hlo = fn.lower(params, tx.init(params)).compile().as_text()
    for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter"):
        assert op not in hlo, op


# ----------------------------------------------------------------------------- schedules, batch ramp


def _sched(kind, **kw):
    c = make_config(schedule=kind, warmup_steps=10, min_lr_ratio=0.1, learning_rate=1.0, **kw)
    return sched.learning_rate_schedules(c)["muon"], sched.learning_rate_schedules(c)["adam"]


def test_warmup_cosine_values():
    s, a = _sched("warmup_cosine")
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
    assert float(s(10)) == pytest.approx(1.0)
    assert float(s(55)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)), rel=1e-5)
    assert float(s(100)) == pytest.approx(0.1, rel=1e-5)
    assert float(a(10)) == pytest.approx(ADAM_LR)


@pytest.mark.parametrize("shape", ["linear", "sqrt"])
def test_wsd_values(shape):
    s, _ = _sched("wsd", decay_fraction=0.2, wsd_decay_shape=shape)
    assert float(s(5)) == pytest.approx(0.5) and float(s(10)) == pytest.approx(1.0)
    assert float(s(50)) == pytest.approx(1.0) and float(s(80)) == pytest.approx(1.0)
    frac = 0.5 if shape == "linear" else math.sqrt(0.5)
    assert float(s(90)) == pytest.approx(0.1 + 0.9 * (1 - frac), rel=1e-5)
    assert float(s(100)) == pytest.approx(0.1, rel=1e-5)


def test_constant_schedule():
    s, _ = _sched("constant")
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
    assert float(s(10)) == float(s(99)) == pytest.approx(1.0)


def test_batch_ramp_lookup_and_validation():
    t = default_config().train
    t.update(dict(steps=100, global_batch_size=8, microbatches=2, batch_ramp=((10, 16), (40, 32))))
    assert [sched.batch_size_at(s, t) for s in (0, 9, 10, 39, 40, 99)] == [8, 8, 16, 16, 32, 32]
    assert sched.ramp_boundaries(t) == (10, 40)
    assert sched.ramp_segments(t) == [(0, 10, 8), (10, 40, 16), (40, 100, 32)]
    assert sched.samples_before(0, t) == 0 and sched.samples_before(12, t) == 80 + 32
    assert sched.samples_before(100, t) == 80 + 480 + 60 * 32
    sched.validate_batch_ramp(t, dp_size=4)
    with pytest.raises(ConfigError, match="global_batch_size"):
        sched.validate_batch_ramp(t, dp_size=8)  # 8 % (8 * 2)
    t.global_batch_size, t.batch_ramp = 16, ((10, 24), (40, 32))
    with pytest.raises(ConfigError, match="step 10"):
        sched.validate_batch_ramp(t, dp_size=8)  # 24 % (8 * 2)
    t.batch_ramp = ()
    assert sched.batch_size_at(50, t) == 16 and sched.ramp_boundaries(t) == ()


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_by_global_norm_with_a_given_norm_equals_optax(max_norm):
    """Our clip, given the norm by the caller or computing it itself, equals `optax.clip_by_global_norm`."""
    grads = jax.tree.map(lambda g: 10.0 * g, small_params(1))
    want, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    norm = opt_lib.global_norm(grads)
    np.testing.assert_allclose(
        float(norm), np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads))), rtol=1e-6
    )
    clip = opt_lib.clip_by_global_norm(max_norm)
    for got, _ in (clip.update(grads, clip.init(grads)), clip.update(grads, clip.init(grads), grad_norm=norm)):
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-9)
