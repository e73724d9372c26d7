"""Block-level tests of the JAX ZAYA1 model against independent NumPy (float64) re-implementations of
docs/architecture.md §2–§7 written here, not calling the code under test: CCA (convs, mean path, value
shift, L2 norm + temperature + partial RoPE, attention), the router (EDA, balancing biases), the MoE skip
slot, the three expert dispatches, capacity drops, and the layer scan.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from zaya_jax.config import model_config, validate_model
from zaya_jax.kernels import resolve
from zaya_jax.model import abstract_model
from zaya_jax.model.cca import CCA
from zaya_jax.model.moe import MoE
from zaya_jax.model.router import Router
from zaya_jax.model.zaya import frozen

TOL = 2e-5  # fp32 model vs float64 reference, relative to the largest reference value
SCALES = ("scale", "h_scale", "r_scale", "in_scale", "eda_scale", "norm", "temp")
BIASES = ("bias", "h_bias", "r_bias", "in_bias", "b_down", "b1", "b2", "conv1_b", "conv2_b")


def make_cfg(**overrides):
    m = model_config()
    m.update(
        dict(
            vocab_size=50,
            hidden_size=24,
            num_layers=3,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=8,
            num_experts=3,
            moe_intermediate_size=16,
            router_hidden_size=8,
            rope_theta=1e4,
            skip_output="zero",
            dispatch="dense",
            dtype="float32",
            param_dtype="float32",
        )
    )
    m.update(overrides)
    validate_model(m)
    return frozen(m)


def fill_random(flat, seed: int, skip_bias: float = 0.0):
    """Random values for every variable of a flat nnx state, in place: weights N(0, 0.3²), scales/norms/temps
    1 + N(0, 0.2²), biases N(0, 0.2²), balancing biases N(0, 0.02²) (+ `skip_bias` on the skip slot)."""
    rng = np.random.default_rng(seed)
    for path, var in flat:
        shape, leaf = var.get_value().shape, path[-1]
        if leaf == "balancing_bias":
            value = 0.02 * rng.standard_normal(shape) + skip_bias * np.eye(shape[-1])[-1]
        else:
            std = 0.2 if leaf in SCALES + BIASES else 0.3
            value = (1.0 if leaf in SCALES else 0.0) + std * rng.standard_normal(shape)
        var.set_value(jnp.asarray(value, var.get_value().dtype))
    return flat


def randomise(module, seed: int, skip_bias: float = 0.0) -> dict[str, np.ndarray]:
    """Randomise `module` in place; return its variables as float64 NumPy keyed 'a.b.c'."""
    nnx.update(module, nnx.from_flat_state(fill_random(nnx.to_flat_state(nnx.state(module)), seed, skip_bias)))
    return arrays_of(module)


def jit_call(method: str = "__call__"):
    """A jitted `module.method(*args)` (one fused compile instead of many eager per-op compiles)."""
    return nnx.jit(lambda module, *args: getattr(module, method)(*args))


CALL, PROJECT, NORM_ROPE = jit_call(), jit_call("project"), jit_call("normalize_and_rotate")


def arrays_of(module) -> dict[str, np.ndarray]:
    return {".".join(p): np.asarray(v.get_value(), np.float64) for p, v in nnx.to_flat_state(nnx.state(module))}


def set_var(module, name: str, value) -> None:
    var = functools.reduce(getattr, name.split("."), module)
    var.set_value(jnp.asarray(value, var.get_value().dtype))


def close(a, ref, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64), ref, rtol=tol, atol=tol)


def rel(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(a - ref)) / max(np.max(np.abs(ref)), 1e-30))


def np_rms(x, w, eps=1e-5):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def np_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_conv_qk(c, w1, b1, w2, b2, pad_once=True):
    """§5c by its time formula. c: [B,S,C], w1: [k0,C], w2: [k1,G,d,d] → z: [B,S,C]. pad_once: y_t = b1 +
    Σ_τ w1[τ]·c_{t-k0+1+τ} for t ≥ -(k1-1), c_{<0} = 0 (y_{-1} = b1); else each conv pads alone (y_{<0} = 0)."""
    b, s, ch = c.shape
    k0, k1, g, d = w1.shape[0], w2.shape[0], w2.shape[1], w2.shape[2]

    def c_at(t):
        return c[:, t] if t >= 0 else np.zeros((b, ch))

    def y_at(t):
        if t < 0 and not pad_once:
            return np.zeros((b, ch))
        return b1 + sum(w1[tau] * c_at(t - (k0 - 1) + tau) for tau in range(k0))

    z = np.zeros((b, s, ch))
    for t in range(s):
        taps = [np.einsum("bgi,gio->bgo", y_at(t - (k1 - 1) + tau).reshape(b, g, d), w2[tau]) for tau in range(k1)]
        z[:, t] = b2 + sum(taps).reshape(b, ch)
    return z


def np_qkv(x, p, nq, nkv, d, pad_once=True):
    """§5a–e: q [B,S,nq,d], k [B,S,nkv,d], v [B,S,nkv,d] for normed x [B,S,H]; p holds the CCA arrays."""
    b, s, h = x.shape
    grp = nq // nkv
    q0, k0 = x @ p["wq"], x @ p["wk"]
    q0h, k0h = q0.reshape(b, s, nq, d), k0.reshape(b, s, nkv, d)
    qm = np.stack([(q0h[:, :, i] + k0h[:, :, i // grp]) / 2 for i in range(nq)], axis=2)
    km = np.stack([np.mean([qm[:, :, i] for i in range(nq) if i // grp == j], axis=0) for j in range(nkv)], axis=2)
    z = np_conv_qk(np.concatenate([q0, k0], -1), p["conv1_w"], p["conv1_b"], p["conv2_w"], p["conv2_b"], pad_once)
    q = z[..., : nq * d].reshape(b, s, nq, d) + qm
    k = z[..., nq * d :].reshape(b, s, nkv, d) + km
    x_prev = np.concatenate([np.zeros((b, 1, h)), x[:, :-1]], axis=1)
    v = np.concatenate([x @ p["wv_cur"], x_prev @ p["wv_del"]], axis=-1).reshape(b, s, nkv, d)
    return q, k, v


def np_norm_rope(q, k, temp, positions, rot, theta, eps):
    """§5f–g: √d·u/max(‖u‖, eps) (keys × temp), then rotate-half RoPE on dims [0, rot) at `positions` [S]."""
    d = q.shape[-1]

    def l2(u):
        return math.sqrt(d) * u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), eps)

    def rope(u):
        half = rot // 2
        phi = np.asarray(positions, np.float64)[:, None] * theta ** (-2.0 * np.arange(half) / rot)  # [S, half]
        cos, sin = np.cos(phi)[None, :, None], np.sin(phi)[None, :, None]
        u1, u2 = u[..., :half], u[..., half:rot]
        return np.concatenate([u1 * cos - u2 * sin, u2 * cos + u1 * sin, u[..., rot:]], axis=-1)

    return rope(l2(q)), rope(l2(k) * temp[None, None, :, None])


def np_attention(q, k, v):
    """§5h causal GQA softmax attention. q [B,S,nq,d], k/v [B,S,nkv,d] → [B,S,nq·d]."""
    b, s, nq, d = q.shape
    grp = nq // k.shape[2]
    outs = []
    for i in range(nq):
        logits = np.einsum("bsd,btd->bst", q[:, :, i], k[:, :, i // grp]) / math.sqrt(d)
        logits = np.where(np.tril(np.ones((s, s), bool)), logits, -np.inf)
        outs.append(np.einsum("bst,btd->bsd", np_softmax(logits), v[:, :, i // grp]))
    return np.concatenate(outs, axis=-1)


def np_cca(x, p, m, positions):
    q, k, v = np_qkv(x, p, m.num_q_heads, m.num_kv_heads, m.head_dim)
    q, k = np_norm_rope(
        q, k, p["temp"], positions, int(m.head_dim * m.partial_rotary_factor), m.rope_theta, m.qk_norm_eps
    )
    return np_attention(q, k, v) @ p["wo"]


def np_router(x, a_prev, p, eps=1e-5):
    """§6 for tokens x [T,H] and incoming state [T,R] → (choice, gate, probs, state)."""
    a = x @ p["w_down"] + p["b_down"] + p["eda_scale"] * a_prev
    u = np_gelu(np_rms(a, p["norm"], eps) @ p["w1"] + p["b1"])
    u = np_gelu(u @ p["w2"] + p["b2"])
    probs = np_softmax(u @ p["w3"])
    choice = np.argmax(probs + p["balancing_bias"], axis=-1)
    return choice, probs[np.arange(len(x)), choice], probs, a


def np_moe(x, a_prev, p, num_experts, skip_output):
    """§7 dropless top-1 MoE with skip slot on tokens x [T,H] → (out [T,H], state, choice)."""
    choice, gate, _, a = np_router(x, a_prev, {k[len("router.") :]: v for k, v in p.items() if k.startswith("router.")})
    out = np.zeros_like(x)
    for t, e in enumerate(choice):
        if e < num_experts:
            gu = x[t] @ p["w_in"][e]
            g, u = np.split(gu, 2)
            out[t] = gate[t] * ((g / (1 + np.exp(-g)) * u) @ p["w_out"][e])
        elif skip_output == "scaled_input":
            out[t] = gate[t] * x[t]
    return out, a, choice


def np_merge(y, r, p):
    return (y + p["h_bias"]) * p["h_scale"] + (r + p["r_bias"]) * p["r_scale"]


@pytest.mark.parametrize("k0, k1", [(2, 2), (3, 2)])
def test_cca_convs_pad_once_and_full_attention(k0, k1):
    m = make_cfg(cca_time0=k0, cca_time1=k1)
    cca = CCA(m, resolve(m), rngs=nnx.Rngs(0))
    p = randomise(cca, seed=1)
    assert np.abs(p["conv1_b"]).min() > 0 and np.abs(p["conv2_b"]).min() > 0
    x = np.random.default_rng(2).standard_normal((2, 5, m.hidden_size))
    q, k, v, _ = PROJECT(cca, jnp.asarray(x, jnp.float32))
    q_ref, k_ref, v_ref = np_qkv(x, p, m.num_q_heads, m.num_kv_heads, m.head_dim)
    for t in (0, 1):  # the first tokens see the left padding
        assert rel(q[:, t], q_ref[:, t]) < TOL and rel(k[:, t], k_ref[:, t]) < TOL
    assert rel(q, q_ref) < TOL and rel(k, k_ref) < TOL and rel(v, v_ref) < TOL  # mean path, value shift
    np.testing.assert_array_equal(np.asarray(v).reshape(2, 5, -1)[:, 0, m.num_kv_heads * m.head_dim // 2 :], 0.0)
    q_sep, k_sep, _ = np_qkv(x, p, m.num_q_heads, m.num_kv_heads, m.head_dim, pad_once=False)
    assert rel(q[:, 0], q_sep[:, 0]) > 1e-2 and rel(k[:, 0], k_sep[:, 0]) > 1e-2  # y_{-1} = b1, not 0
    close(q[:, k0 + k1 - 2 :], q_sep[:, k0 + k1 - 2 :], tol=1e-4)
    out = CALL(cca, jnp.asarray(x, jnp.float32), jnp.arange(5)[None])  # the whole sub-layer, attention included
    assert rel(out, np_cca(x, p, m, np.arange(5))) < TOL


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_l2_norm_temperature_partial_rope(factor):
    m = make_cfg(partial_rotary_factor=factor)
    cca = CCA(m, resolve(m), rngs=nnx.Rngs(0))
    p = randomise(cca, seed=5)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 6, m.num_q_heads, m.head_dim))
    k = rng.standard_normal((2, 6, m.num_kv_heads, m.head_dim))
    positions = np.arange(3, 9)  # a non-zero offset exercises the phase
    qn, kn = NORM_ROPE(cca, jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), jnp.asarray(positions)[None])
    q_ref, k_ref = np_norm_rope(q, k, p["temp"], positions, int(m.head_dim * factor), m.rope_theta, m.qk_norm_eps)
    assert rel(qn, q_ref) < TOL and rel(kn, k_ref) < TOL
    root_d = math.sqrt(m.head_dim)  # rotation keeps ‖q̂‖ = √d and ‖k̂‖ = √d·|temp|
    close(np.linalg.norm(np.asarray(qn), axis=-1), np.full((2, 6, m.num_q_heads), root_d))
    close(np.linalg.norm(np.asarray(kn), axis=-1), np.broadcast_to(root_d * np.abs(p["temp"]), (2, 6, 2)))


def test_eda_recursion_three_layers():
    """a_i = D_i(x_i) + s_i ⊙ a_{i-1} carried pre-norm; unrolled a_2 = D_2 + s_2⊙D_1 + s_2⊙s_1⊙D_0 (§6)."""
    m = make_cfg()
    routers = [Router(m, resolve(m), rngs=nnx.Rngs(i)) for i in range(3)]
    ps = [randomise(r, seed=10 + i) for i, r in enumerate(routers)]
    xs = np.random.default_rng(9).standard_normal((3, 12, m.hidden_size))
    state, state_ref = jnp.zeros((12, m.router_hidden_size)), np.zeros((12, m.router_hidden_size))
    downs = []
    for router, p, x in zip(routers, ps, xs):
        routing = CALL(router, jnp.asarray(x, jnp.float32), state)
        choice, gate, probs, state_ref = np_router(x, state_ref, p)
        state = routing.state
        downs.append(x @ p["w_down"] + p["b_down"])
        assert max(rel(routing.state, state_ref), rel(routing.probs, probs), rel(routing.gate, gate)) < TOL
        np.testing.assert_array_equal(np.asarray(routing.choice), choice)
    s1, s2 = ps[1]["eda_scale"], ps[2]["eda_scale"]
    assert rel(state, downs[2] + s2 * downs[1] + s2 * s1 * downs[0]) < TOL
    # the first router's EDA scale is dead: it only ever sees a zero incoming state
    before = CALL(routers[0], jnp.asarray(xs[0], jnp.float32), jnp.zeros((12, m.router_hidden_size)))
    set_var(routers[0], "eda_scale", 5.0 * np.ones(m.router_hidden_size))
    after = CALL(routers[0], jnp.asarray(xs[0], jnp.float32), jnp.zeros((12, m.router_hidden_size)))
    np.testing.assert_array_equal(np.asarray(before.probs), np.asarray(after.probs))


def test_balancing_bias_changes_choice_not_gate():
    m = make_cfg(num_experts=4)
    router = Router(m, resolve(m), rngs=nnx.Rngs(0))
    p = randomise(router, seed=20)
    x = jnp.asarray(np.random.default_rng(21).standard_normal((64, m.hidden_size)), jnp.float32)
    zero = CALL(router, x, jnp.zeros((64, m.router_hidden_size)))
    p["balancing_bias"] = np.array([0.0, 0.15, -0.1, 0.05, -0.2])
    set_var(router, "balancing_bias", p["balancing_bias"])
    biased = CALL(router, x, jnp.zeros((64, m.router_hidden_size)))
    choice, gate, probs, _ = np_router(np.asarray(x, np.float64), 0.0, p)
    np.testing.assert_array_equal(np.asarray(biased.probs), np.asarray(zero.probs))  # probabilities untouched
    np.testing.assert_array_equal(np.asarray(biased.choice), choice)
    assert (np.asarray(biased.choice) != np.asarray(zero.choice)).any()
    assert rel(biased.gate, gate) < TOL  # g = p[e*]: unbiased, not renormalised
    np.testing.assert_array_equal(np.asarray(biased.gate), np.asarray(biased.probs)[np.arange(64), choice])
    set_var(router, "balancing_bias", np.array([0.0, 3.0, 0.0, 0.0, 0.0]))  # force expert 1 everywhere
    forced = CALL(router, x, jnp.zeros((64, m.router_hidden_size)))
    np.testing.assert_array_equal(np.asarray(forced.choice), 1)
    np.testing.assert_array_equal(np.asarray(forced.gate), np.asarray(zero.probs)[:, 1])


def make_moe(m, seed: int, skip_bias: float = 0.0):
    return (moe := MoE(m, resolve(m), rngs=nnx.Rngs(0))), randomise(moe, seed=seed, skip_bias=skip_bias)


@pytest.mark.parametrize("skip_output", ["scaled_input", "zero"])
def test_skip_slot_modes(skip_output):
    m = make_cfg(skip_output=skip_output)
    x = np.random.default_rng(30).standard_normal((2, 8, m.hidden_size))
    state = jnp.zeros((2, 8, m.router_hidden_size))
    moe, p = make_moe(m, seed=31, skip_bias=2.0)  # β_skip forced high: every token skips
    out, _, stats = CALL(moe, jnp.asarray(x, jnp.float32), state)
    routing = CALL(moe.router, jnp.asarray(x, jnp.float32), state)
    np.testing.assert_array_equal(np.asarray(routing.choice), m.num_experts)
    assert int(stats.counts[m.num_experts]) == 16
    expect = np.asarray(routing.gate)[..., None] * x if skip_output == "scaled_input" else np.zeros_like(x)
    np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-6, atol=0)  # "zero": exactly 0
    moe, p = make_moe(m, seed=32, skip_bias=0.05)  # mixed routing: experts and skip
    out, _, stats = CALL(moe, jnp.asarray(x, jnp.float32), state)
    ref, _, choice = np_moe(x.reshape(16, -1), 0.0, p, m.num_experts, skip_output)
    assert 0 < (choice == m.num_experts).sum() < 16
    np.testing.assert_array_equal(np.asarray(stats.counts), np.bincount(choice, minlength=m.num_experts + 1))
    assert rel(np.asarray(out).reshape(16, -1), ref) < TOL


def moe_outputs_and_grads(moe, x, state, cotangent):
    """MoE output, stats and d<out, cotangent>/d(params, x)."""
    graphdef, params, rest = nnx.split(moe, nnx.Param, ...)

    def f(params, x):
        out, _, stats = nnx.merge(graphdef, params, rest)(x, state)
        return jnp.sum(out * cotangent), (out, stats)

    (_, (out, stats)), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(params, x)
    return out, stats, grads


def test_dispatches_agree_outputs_and_gradients():
    base = make_cfg(num_experts=4, skip_output="scaled_input")
    rng = np.random.default_rng(40)
    x = jnp.asarray(rng.standard_normal((2, 16, base.hidden_size)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((2, 16, base.hidden_size)), jnp.float32)
    state = jnp.asarray(rng.standard_normal((2, 16, base.router_hidden_size)), jnp.float32)
    ref_moe, _ = make_moe(base, seed=41, skip_bias=0.05)
    results = {}
    # tokamax: its XLA implementation on CPU (the Pallas kernels need a GPU), so this checks the wiring;
    # ragged_dot_bf16 gives its results in the compute dtype, fp32 here (bf16: tests/kernels/test_kernels.py)
    others = ("dropless:ragged_dot", "dropless:ragged_dot_bf16", "capacity", "dropless:loops", "dropless:tokamax")
    for name in ("dense", *others):
        dispatch, _, kernel = name.partition(":")
        m = make_cfg(num_experts=4, skip_output="scaled_input", dispatch=dispatch, capacity_factor=4.0).as_configdict()
        m.kernels.grouped_gemm = kernel or "auto"
        moe = MoE(frozen(m), resolve(m), rngs=nnx.Rngs(1))
        nnx.update(moe, nnx.state(ref_moe))
        results[name] = moe_outputs_and_grads(moe, x, state, cot)
    out, stats, grads = results["dense"]
    counts = np.asarray(stats.counts)
    assert counts[-1] > 0 and (counts[:-1] > 0).sum() >= 2
    for name in others:
        o, s, g = results[name]
        assert int(s.dropped) == 0
        np.testing.assert_array_equal(np.asarray(s.counts), counts)
        assert rel(o, out) < 1e-6, name
        for (path, ref), got in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(g), strict=True):
            assert rel(got, ref) <= 1e-5, (name, jax.tree_util.keystr(path))


def test_capacity_drops_tokens_to_exact_zero():
    m = make_cfg(num_experts=3, dispatch="capacity", capacity_factor=0.5, skip_output="scaled_input")
    moe, p = make_moe(m, seed=50)
    p["router.balancing_bias"] = np.array([0.3, 0.0, 0.0, -1.0])  # most tokens to expert 0: overflow
    set_var(moe, "router.balancing_bias", p["router.balancing_bias"])
    x = np.random.default_rng(51).standard_normal((1, 24, m.hidden_size))
    out, _, stats = CALL(moe, jnp.asarray(x, jnp.float32), jnp.zeros((1, 24, m.router_hidden_size)))
    ref, _, choice = np_moe(x[0], 0.0, p, m.num_experts, "scaled_input")
    cap = max(1, min(24, math.ceil(0.5 * 24 / 3)))  # slots per expert
    pos = np.array([(choice[:t] == choice[t]).sum() for t in range(24)])  # arrival order within the expert
    dropped = (choice < m.num_experts) & (pos >= cap)
    assert int(stats.dropped) == dropped.sum() > 0
    np.testing.assert_array_equal(np.asarray(stats.counts), np.bincount(choice, minlength=4))  # before drops
    out = np.asarray(out)[0]
    np.testing.assert_array_equal(out[dropped], 0.0)
    assert rel(out[~dropped], ref[~dropped]) < TOL


def np_model(ids, a: dict[str, np.ndarray], m):
    """§2 with the NumPy blocks above, layer by layer."""
    b, s = ids.shape
    r = (a["embed"][ids] + a["in_bias"]) * a["in_scale"]
    state = np.zeros((b * s, m.router_hidden_size))
    for i in range(m.num_layers):
        lp = {k[len("layers.") :]: v[i] for k, v in a.items() if k.startswith("layers.")}
        sub = lambda pre: {k[len(pre) :]: v for k, v in lp.items() if k.startswith(pre)}  # noqa: E731
        y = np_cca(np_rms(r, lp["attn_norm.scale"]), sub("attn."), m, np.arange(s))
        r = np_merge(y, r, sub("attn_merge."))
        x = np_rms(r, lp["moe_norm.scale"]).reshape(b * s, -1)
        z, state, _ = np_moe(x, state, sub("moe."), m.num_experts, m.skip_output)
        r = np_merge(z.reshape(b, s, -1), r, sub("moe_merge."))
    return np_rms(r, a["final_norm.scale"]) @ a["embed"].T


@pytest.mark.parametrize("skip_output", ["scaled_input", "zero"])
def test_scan_equals_unrolled_loop_and_numpy(skip_output):
    m = make_cfg(skip_output=skip_output, dispatch="dropless")
    graphdef, state = nnx.split(abstract_model(m))  # a fully random model, skip slot reachable
    model = nnx.merge(graphdef, nnx.from_flat_state(fill_random(nnx.to_flat_state(state), 60, skip_bias=0.05)))
    ids = np.random.default_rng(61).integers(0, m.vocab_size, size=(2, 7))
    out = jit_call("forward")(model, jnp.asarray(ids))
    # unrolled: the same per-layer modules, called one after another in Python
    r = (model.embed[...][ids] + model.in_bias[...][None, None]) * model.in_scale[...][None, None]
    state = jnp.zeros((2, 7, m.router_hidden_size))
    graphdef, stacked = nnx.split(model.layers)
    counts = []
    for i in range(m.num_layers):
        layer = nnx.merge(graphdef, jax.tree.map(lambda v: v[i], stacked))
        r, state, stats = CALL(layer, r, state, jnp.arange(7)[None])
        counts.append(np.asarray(stats.counts))
    logits = model.final_norm(r) @ model.embed[...].T
    assert rel(out.logits, logits) < 1e-6
    np.testing.assert_array_equal(np.asarray(out.stats.counts), np.stack(counts))
    assert np.asarray(out.stats.counts)[:, -1].sum() > 0  # the skip slot is exercised
    assert rel(out.logits, np_model(ids, arrays_of(model), m)) < TOL
