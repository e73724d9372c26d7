"""The kernels of `zaya_jax.kernels` against independent float64 NumPy computations (every implementation that
runs on CPU), and how `model.kernels` resolves for each platform (docs/kernels.md)."""

from __future__ import annotations

import math
import pathlib

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.model.test_model_reference import TOL, make_cfg, np_attention, rel
from zaya_jax import kernels
from zaya_jax.checkpoint.model_io import config_from_meta
from zaya_jax.config import ConfigError, model_config, validate_model
from zaya_jax.kernels import attention, matmul
from zaya_jax.kernels.grouped_loops import PAD, grouped_swiglu
from zaya_jax.model import init_model

MATMULS = ("xla", "xla_cpu")


@pytest.mark.parametrize("impl", MATMULS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tokens", [6, 7])
def test_matmul_gradients_match_numpy(impl, dtype, tokens):
    """`matmul` on [B, S, K] (flattened to one token axis) and its input and weight gradients (`xla_cpu` in bf16:
    read from forward-layout copies; even and odd token counts) against NumPy in float64."""
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    x = jnp.asarray(rng.normal(size=(1, tokens, 5)), dt)
    w = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    g = rng.normal(size=(1, tokens, 3))
    y, vjp = jax.vjp(lambda x, w: matmul.matmul(x, w, dt, impl), x, w)
    dx, dw = vjp(jnp.asarray(g, jnp.float32))
    xn, wn = np.asarray(x, np.float64), np.asarray(w.astype(dt), np.float64)
    gn = np.asarray(jnp.asarray(g, jnp.float32).astype(dt), np.float64)  # the backward casts g to the compute dtype
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert y.shape == (1, tokens, 3) and y.dtype == jnp.float32 and dw.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), xn @ wn, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(dw), xn[0].T @ gn[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(dx, np.float64), gn @ wn.T, rtol=tol, atol=5 * tol)


@pytest.mark.parametrize("seq, chunk, blocks", [(12, 4, 3), (12, 12, 1), (10, 4, 2), (11, 4, 1), (64, 2, 16)])
def test_chunked_causal_attention_matches_numpy_and_the_full_square(seq, chunk, blocks):
    """Query blocks that see only the keys up to their own end (`model.attention_chunk`) give NumPy's causal
    attention, and the gradients of a plain masked-square jnp attention. Blocks are equal: 10 tokens at chunk 4
    go in 2 blocks of 5, 11 (prime) in one; at most 16 blocks."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, seq, n, 8)) for n in (4, 2, 2))
    g = rng.standard_normal((2, seq, 4, 8))

    def square(q, k, v):  # independent of zaya_jax: the masked S×S square
        qg = q.reshape(2, seq, 2, 2, 8)
        logits = jnp.einsum("bqkgd,bskd->bkgqs", qg, k) / math.sqrt(8)
        logits = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), logits, -jnp.inf)
        return jnp.einsum("bkgqs,bskd->bqkgd", jax.nn.softmax(logits, -1), v).reshape(2, seq, 4, 8)

    args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
    out, vjp = jax.vjp(lambda q, k, v: attention.causal_attention(q, k, v, jnp.float32, chunk=chunk), *args)
    assert rel(out.reshape(2, seq, -1), np_attention(q, k, v)) < TOL
    _, vjp_ref = jax.vjp(square, *args)
    for got, want in zip(vjp(jnp.asarray(g, jnp.float32)), vjp_ref(jnp.asarray(g, jnp.float32))):
        assert rel(got, want) < TOL
    assert attention.attention_chunks(seq, chunk) == blocks


def test_grouped_loops_bf16_gradients_match_numpy():
    """The `loops` grouped expert GEMMs in bf16 (backward operands copied into the forward layout, fp32 accumulation)
    against a float64 NumPy SwiGLU per expert on the same bf16-rounded inputs: outputs and all three gradients.
    The weights are layer-stacked (layer 1 of 2, as the layer scan passes them): the other layer's weights get a
    zero gradient."""
    rng = np.random.default_rng(7)
    # an empty expert, groups of one chunk, one of a full chunk and no rest (256), one of a full chunk and a rest
    sizes = np.array([21, 0, 300, 256, 35], np.int32)
    e, h, i = len(sizes), 16, 8
    t = int(sizes.sum())
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    bf = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64)  # noqa: E731
    xs = bf(np.concatenate([rng.normal(size=(t, h)), np.zeros((PAD, h))]))
    w_in, w_out = rng.normal(size=(e, h, 2 * i)) / 4, rng.normal(size=(e, i, h)) / 3
    cot = bf(rng.normal(size=(t + PAD, h)))  # the backward casts the cotangent to bf16

    other = lambda w: np.stack([rng.normal(size=w.shape), w])  # noqa: E731  (layer 0: unused weights)

    def loss(xs, w_in, w_out):
        ys = grouped_swiglu(xs, jnp.asarray(starts), jnp.asarray(sizes), w_in, w_out, jnp.int32(1))
        return jnp.sum(ys * jnp.asarray(cot, jnp.float32)), ys

    (_, ys), (dx, dwi_all, dwo_all) = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        jnp.asarray(xs, jnp.bfloat16), jnp.asarray(other(w_in), jnp.float32), jnp.asarray(other(w_out), jnp.float32)
    )
    assert not np.any(np.asarray(dwi_all[0])) and not np.any(np.asarray(dwo_all[0]))
    dwi, dwo = dwi_all[1], dwo_all[1]
    ref_y, ref_dx = np.zeros_like(xs), np.zeros_like(xs)
    ref_dwi, ref_dwo = np.zeros((e, h, 2 * i)), np.zeros((e, i, h))
    for k in range(e):
        rows = slice(starts[k], starts[k] + sizes[k])
        x, wi, wo, dy = xs[rows], bf(w_in[k]), bf(w_out[k]), cot[rows]
        g, u = np.split(x @ wi, 2, axis=-1)
        sig = 1 / (1 + np.exp(-g))
        act = g * sig * u
        ref_y[rows] = act @ wo
        da = dy @ wo.T
        dgu = np.concatenate([da * u * sig * (1 + g * (1 - sig)), da * g * sig], axis=-1)
        ref_dwo[k], ref_dwi[k], ref_dx[rows] = act.T @ dy, x.T @ dgu, dgu @ wi.T
    assert ys.dtype == jnp.float32 and dx.dtype == jnp.bfloat16 and dwi.dtype == jnp.float32
    for got, ref in ((ys, ref_y), (dx, ref_dx), (dwi, ref_dwi), (dwo, ref_dwo)):
        assert rel(np.asarray(got, np.float64), ref) < 2e-2


@pytest.mark.parametrize("kernel, result", [("ragged_dot", jnp.float32), ("ragged_dot_bf16", jnp.bfloat16)])
def test_ragged_grouped_gemms_bf16_match_numpy(kernel, result):
    """The `ragged_dot` grouped expert GEMMs in bf16 (`dropless_swiglu`: sort, two ragged_dots, unsort, gate)
    against a float64 NumPy SwiGLU per token on the same bf16-rounded inputs: output and the gradients of x, w_in
    and w_out (fp32 weights: their gradients come back in fp32). Every ragged_dot of the forward and the backward
    gives `result` (`ragged_dot_bf16`: bf16, what ROCm lowers to hipBLASLt's grouped GEMM). Tolerance 1e-2 of
    the largest reference value (seen: 3.5e-3 with fp32 results, 6.3e-3 with bf16 ones). bf16 results are safe
    because the operands are bf16 already (relative error 2^-9 each), the
    GEMMs accumulate in fp32 (on CPU XLA computes a bf16 dot in fp32 and rounds its result; on GPUs the GEMM
    accumulates in fp32), so a bf16 result adds one more rounding of 2^-9 per element, independent of the
    contraction length, and the SwiGLU between the GEMMs runs in fp32."""
    from zaya_jax.kernels.grouped import ExpertWeights, dropless_swiglu

    rng = np.random.default_rng(11)
    e, h, i, t = 4, 16, 8, 40
    choice = rng.integers(0, e + 1, size=t).astype(np.int32)  # E = skip tokens
    choice[choice == 1] = 2  # an expert with no tokens
    bf = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64)  # noqa: E731
    x = bf(rng.normal(size=(t, h)))
    w_in, w_out = rng.normal(size=(e, h, 2 * i)) / 4, rng.normal(size=(e, i, h)) / 3
    gate, cot = rng.uniform(0.2, 1.0, size=t), rng.normal(size=(t, h))

    def loss(x, w_in, w_out):
        ys = dropless_swiglu(kernel, x, jnp.asarray(choice), jnp.asarray(gate, jnp.float32), ExpertWeights(w_in, w_out))
        return jnp.sum(ys * jnp.asarray(cot, jnp.float32)), ys

    args = (jnp.asarray(x, jnp.bfloat16), jnp.asarray(w_in, jnp.float32), jnp.asarray(w_out, jnp.float32))
    grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    jaxpr = jax.make_jaxpr(grad)(*args).jaxpr
    ragged = [eq for eq in jaxpr.eqns if eq.primitive.name == "ragged_dot_general"]
    assert len(ragged) == 6 and {eq.outvars[0].aval.dtype for eq in ragged} == {jnp.dtype(result)}
    (_, ys), (dx, dwi, dwo) = grad(*args)
    ref_y, ref_dx = np.zeros_like(x), np.zeros_like(x)
    ref_dwi, ref_dwo = np.zeros((e, h, 2 * i)), np.zeros((e, i, h))
    for k in range(t):
        if choice[k] == e:
            continue
        wi, wo = bf(w_in[choice[k]]), bf(w_out[choice[k]])
        g, u = np.split(x[k] @ wi, 2)
        sig = 1 / (1 + np.exp(-g))
        act = g * sig * u
        ref_y[k] = gate[k] * (act @ wo)
        da = (gate[k] * cot[k]) @ wo.T
        dgu = np.concatenate([da * u * sig * (1 + g * (1 - sig)), da * g * sig])
        ref_dwo[choice[k]] += np.outer(act, gate[k] * cot[k])
        ref_dwi[choice[k]] += np.outer(x[k], dgu)
        ref_dx[k] = dgu @ wi.T
    assert ys.dtype == jnp.float32 and dx.dtype == jnp.bfloat16 and dwi.dtype == dwo.dtype == jnp.float32
    assert not np.any(np.asarray(ys)[choice == e]) and not np.any(np.asarray(dwi)[1])
    for got, ref in ((ys, ref_y), (dx, ref_dx), (dwi, ref_dwi), (dwo, ref_dwo)):
        assert rel(np.asarray(got, np.float64), ref) < 1e-2


@pytest.mark.parametrize(
    "spec, shape_a, shape_b",
    [
        ("gbti,gio->gbto", (3, 2, 5, 8), (3, 8, 8)),  # the CCA grouped conv
        ("bqkgd,bskd->bkgqs", (2, 5, 2, 2, 8), (2, 5, 2, 8)),  # attention logits
        ("bkgqs,bskd->bqkgd", (2, 2, 2, 5, 5), (2, 5, 2, 8)),  # attention output
    ],
)
@pytest.mark.parametrize("impl", MATMULS)
def test_bf16_einsums_match_numpy_through_a_layer_scan(spec, shape_a, shape_b, impl):
    """`einsum` in bf16 inside a scan over two layers (`xla_cpu`: operands permuted into the GEMM layout,
    residuals stacked as bits) against float64 NumPy on the same bf16-rounded values: outputs and both
    gradients."""
    rng = np.random.default_rng(11)
    bf = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64)  # noqa: E731
    a, b = bf(rng.normal(size=(2, *shape_a))), bf(rng.normal(size=(2, *shape_b)))
    out_shape = jax.eval_shape(lambda x, y: jnp.einsum(spec, x, y), a[0], b[0]).shape
    cot = bf(rng.normal(size=(2, *out_shape)))

    def loss(a, b):
        ys = jax.lax.scan(lambda c, ab: (c, matmul.einsum(spec, ab[0], ab[1], jnp.bfloat16, impl)), 0.0, (a, b))[1]
        return jnp.sum(ys * jnp.asarray(cot, jnp.float32)), ys

    (_, ys), (da, db) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)
    )
    inputs, out = spec.split("->")
    sa, sb = inputs.split(",")
    stacked = lambda s: "L" + s  # noqa: E731  (the layer axis)
    ref_y = np.einsum(f"{stacked(sa)},{stacked(sb)}->{stacked(out)}", a, b)
    ref_da = np.einsum(f"{stacked(out)},{stacked(sb)}->{stacked(sa)}", cot, b)
    ref_db = np.einsum(f"{stacked(sa)},{stacked(out)}->{stacked(sb)}", a, cot)
    assert ys.dtype == jnp.float32 and da.dtype == db.dtype == jnp.bfloat16
    assert rel(np.asarray(ys, np.float64), ref_y) < 1e-5
    for got, ref in ((da, ref_da), (db, ref_db)):
        assert rel(np.asarray(got, np.float64), ref) < 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_attention_wrapper_matches_numpy(dtype):
    """The fused-kernel wrapper (scale 1/√d, causal, GQA head groups) through `jax.nn.dot_product_attention`'s
    XLA implementation — the cuDNN one needs a CUDA device — against NumPy's §5h attention."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 9, n, 8)) for n in (4, 2, 2))
    dt = jnp.dtype(dtype)
    out = attention.fused_causal_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), dt, "xla")
    bf = lambda a: np.asarray(jnp.asarray(a, dt), np.float64)  # noqa: E731  (operands rounded as the kernel's)
    assert out.dtype == dt and out.shape == (2, 9, 4, 8)
    assert rel(np.asarray(out, np.float64).reshape(2, 9, -1), np_attention(bf(q), bf(k), bf(v))) < (
        TOL if dtype == "float32" else 2e-2
    )


def test_pallas_attention_matches_xla_forward_and_backward():
    """The `pallas` kernel (jax's Pallas Triton flash attention, run by Pallas's interpreter on CPU; GQA by
    repeated kv heads) against the `xla` einsums on the same bf16-rounded operands: outputs and the gradients of
    q, k and v; the output also against NumPy's §5h attention. 32 tokens: one 32-row forward block and one
    32 × 32 backward block per head."""
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 32, n, 16)), jnp.bfloat16) for n in (4, 2, 2))
    cot = jnp.asarray(rng.standard_normal((2, 32, 4, 16)), jnp.float32)
    dt = jnp.bfloat16
    assert attention.pallas_fits(32, 16) and not attention.pallas_fits(36, 16) and not attention.pallas_fits(32, 24)

    def run(fn):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v).astype(jnp.float32), q, k, v)
        return out, vjp(cot)

    out, grads = run(lambda q, k, v: attention.pallas_causal_attention(q, k, v, dt, interpret=True))
    ref, ref_grads = run(lambda q, k, v: attention.causal_attention(q, k, v, dt))
    as64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    assert rel(as64(out).reshape(2, 32, -1), np_attention(as64(q), as64(k), as64(v))) < 2e-2
    assert rel(out, ref) < 2e-2
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.shape == want.shape and rel(as64(got), as64(want)) < 3e-2


def kernel_cfg(dtype="float32", **chosen):
    m = model_config()
    m.dtype = dtype
    m.kernels.update(chosen)
    validate_model(m)
    return m


@pytest.mark.parametrize(
    "platform, dtype, tokamax, expected",
    [
        ("cpu", "bfloat16", "", ("xla_cpu", "loops", "xla")),
        ("cuda", "bfloat16", "", ("xla", "tokamax", "cudnn")),  # a tokamax that compiles for GPUs is installed
        ("cuda", "bfloat16", "tokamax 0.0.12 is older", ("xla", "ragged_dot", "cudnn")),  # one that does not
        ("cuda", "float32", "", ("xla", "tokamax", "xla")),  # cuDNN's fused attention takes bf16 / fp16 only
        ("rocm", "bfloat16", "", ("xla", "ragged_dot_bf16", "pallas")),  # bf16 results: hipBLASLt's grouped GEMM
        ("rocm", "float32", "", ("xla", "ragged_dot_bf16", "xla")),  # the fused kernels take bf16 only
    ],
)
def test_auto_resolves_per_target_platform(platform, dtype, tokamax, expected, monkeypatch):
    # "" (usable) or why not; tests/kernels/test_choice.py checks the reading of the installed tokamax
    monkeypatch.setattr(kernels.choice, "tokamax_unusable", lambda: tokamax)
    chosen = kernels.resolve(kernel_cfg(dtype, platform=platform))
    assert (chosen.platform, chosen.matmul, chosen.grouped_gemm, chosen.attention) == (platform, *expected)


def test_explicit_kernels_win_and_auto_platform_is_this_process(monkeypatch):
    monkeypatch.setattr(kernels.choice, "tokamax_unusable", lambda: "no tokamax")
    chosen = kernels.resolve(kernel_cfg("bfloat16", platform="rocm", grouped_gemm="tokamax", matmul="xla_cpu"))
    assert (chosen.matmul, chosen.grouped_gemm, chosen.attention) == ("xla_cpu", "tokamax", "pallas")
    assert kernels.resolve(kernel_cfg()).platform == "cpu"  # the tests run on CPU devices
    resolved = kernels.resolved_config(kernel_cfg(platform="cuda"))
    assert dict(resolved.kernels) == dict(platform="cuda", matmul="xla", grouped_gemm="ragged_dot", attention="xla")
    assert str(kernels.resolve(resolved)) == "platform=cuda matmul=xla grouped_gemm=ragged_dot attention=xla"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("kernels.attention", "flash", "model.kernels.attention='flash'; choose one of"),
        ("kernels.grouped_gemm", "megablox", "model.kernels.grouped_gemm='megablox'; choose one of"),
        ("kernels.attention", "cudnn", "model.kernels.attention=cudnn needs model.dtype=bfloat16 on CUDA"),
        ("kernels.attention", "pallas", "model.kernels.attention=pallas needs model.dtype=bfloat16"),
        ("dispatch", "grouped", "model.dispatch=dropless with model.kernels.grouped_gemm=loops"),
        ("dispatch", "ragged", "model.dispatch=dropless with model.kernels.grouped_gemm=ragged_dot"),
    ],
)
def test_bad_kernel_choices_get_one_line(field, value, message):
    m = model_config()
    section, _, name = field.rpartition(".")
    (m[section] if section else m)[name] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate_model(m)


def test_model_code_never_asks_for_the_backend():
    """The platform is chosen once (`kernels.resolve`); nothing under zaya_jax/model/ reads it while tracing."""
    model_dir = pathlib.Path(kernels.__file__).parents[1] / "model"
    offenders = [p.name for p in model_dir.glob("*.py") if "default_backend" in p.read_text()]
    assert offenders == []


def test_xla_and_xla_cpu_matmuls_train_identically_in_fp32():
    """fp32 has no XLA:CPU specialisation: the tiny model's loss and gradients are bit-identical either way."""

    def loss_and_grads(impl):
        m = make_cfg(dispatch="dropless").as_configdict()
        m.kernels.matmul = impl
        model = init_model(m, seed=3)
        ids = jnp.asarray(np.random.default_rng(0).integers(0, m.vocab_size, size=(2, 8)))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        f = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(ids) ** 2)  # noqa: E731
        return jax.jit(jax.value_and_grad(f))(params)

    (la, ga), (lb, gb) = loss_and_grads("xla"), loss_and_grads("xla_cpu")
    assert float(la) == float(lb)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("old, kernel", [("grouped", "loops"), ("ragged", "ragged_dot")])
def test_checkpoints_saved_with_the_old_dispatch_names_still_load(old, kernel):
    """A checkpoint's saved config from before `model.kernels` names `grouped` / `ragged`: it loads as `dropless`
    with that grouped-GEMM kernel (the same computation), and validates."""
    saved = model_config().to_dict()
    del saved["kernels"]
    saved["dispatch"] = old
    config = config_from_meta({"config": {"model": saved}})
    assert (config.model.dispatch, config.model.kernels.grouped_gemm) == ("dropless", kernel)
    validate_model(config.model)


def test_pallas_transpose_matches_swapaxes():
    """`kernels.transpose.pallas_transpose` (the per-layer weight transpose of the tokamax path on GPUs) in Pallas's
    interpreter: exactly `swapaxes(1, 2)`, bf16 in and out, over several 64 × 64 tiles per matrix."""
    from zaya_jax.kernels.transpose import fits, pallas_transpose

    w = np.random.default_rng(3).normal(size=(2, 128, 192)).astype(np.float32)
    got = pallas_transpose(jnp.asarray(w, jnp.bfloat16), interpret=True)
    assert got.dtype == jnp.bfloat16 and fits(w.shape) and not fits((2, 100, 64))
    np.testing.assert_array_equal(
        np.asarray(got, np.float32), np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32).swapaxes(1, 2)
    )


def test_tokamax_wrapper_gradients_equal_ragged_dot():
    """`grouped._weights_transposed_per_layer` (tokamax's ragged dot with the input gradient taken against a transposed
    copy of the layer's weights) around `jax.lax.ragged_dot`: output and both gradients equal those of
    `jax.lax.ragged_dot` itself (fp32, CPU: the transposed copy is `swapaxes`; bf16 results as the tokamax path)."""
    from zaya_jax.kernels.grouped import _weights_transposed_per_layer

    rng = np.random.default_rng(5)
    lhs = jnp.asarray(rng.normal(size=(24, 16)), jnp.bfloat16)
    rhs = jnp.asarray(rng.normal(size=(3, 16, 8)), jnp.bfloat16)
    sizes, cot = jnp.asarray([10, 0, 14], jnp.int32), jnp.asarray(rng.normal(size=(24, 8)), jnp.float32)

    def loss(dot):
        return lambda a, b: jnp.sum(dot(a, b, sizes, preferred_element_type=jnp.bfloat16).astype(jnp.float32) * cot)

    wrapped = lambda a, b, s, preferred_element_type: _weights_transposed_per_layer(  # noqa: E731
        jax.lax.ragged_dot, "cpu", a, b, s, preferred_element_type
    )
    got = jax.value_and_grad(loss(wrapped), argnums=(0, 1))(lhs, rhs)
    ref = jax.value_and_grad(loss(jax.lax.ragged_dot), argnums=(0, 1))(lhs, rhs)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=1e-2, atol=1e-2)
