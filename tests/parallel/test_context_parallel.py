"""Context-parallel CCA (`zaya_jax.model.cca_context`): equality with an independent single-device computation
(one CCA layer with random biases; the full model's loss and gradients at sequence 1024), both layouts,
the compiled collectives, and config errors."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding

from tests.tools.helpers import assert_trees_close, mean_loss_and_grads, random_batch, rel_err, tiny_config
from zaya_jax.config import CONTEXT_LAYOUTS, ConfigError, validate
from zaya_jax.kernels import resolve
from zaya_jax.model import cca_context as context
from zaya_jax.model.cca import CCA
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import AXES, make_mesh
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import abstract_train_state
from zaya_jax.train.step import loss_and_grads

SEQ, BATCH = 1024, 4


def _mesh(data: int, ctx: int, expert: int = 1):
    return jax.make_mesh((data, ctx, expert), AXES, axis_types=(AxisType.Auto,) * 3)


# ----------------------------------------------------------------------------- one CCA layer


@pytest.fixture(scope="module")
def cca_case():
    """A CCA layer with non-zero conv biases and key temperatures, input x [4, 64, H], dense reference."""
    m = tiny_config().model
    attn = CCA(m, resolve(m), rngs=nnx.Rngs(params=0))
    keys = jax.random.split(jax.random.key(1), 3)
    attn.conv1_b[...] = 0.3 * jax.random.normal(keys[0], attn.conv1_b.shape)
    attn.conv2_b[...] = 0.3 * jax.random.normal(keys[1], attn.conv2_b.shape)
    attn.temp[...] = jnp.array([1.3, 0.7])
    graphdef, state = nnx.split(attn)
    x = jax.random.normal(keys[2], (4, 64, m.hidden_size))
    positions = jnp.arange(64, dtype=jnp.int32)[None]

    def dense(state, x):
        y = nnx.merge(graphdef, state)(x, positions)
        return jnp.sum(jnp.sin(y)), y

    grads, y = jax.grad(dense, argnums=(0, 1), has_aux=True)(state, x)
    return graphdef, state, x, positions, y, grads


@pytest.mark.parametrize("layout", CONTEXT_LAYOUTS)
@pytest.mark.parametrize("data,ctx", [(4, 2), (1, 8)])
def test_cca_layer_matches_dense(cca_case, layout, data, ctx):
    """Chunks of 64 / 8 (contiguous) or 64 / 16 = 4 tokens (zigzag, context 8): every chunk boundary needs halos."""
    graphdef, state, x, positions, ref_y, ref_grads = cca_case

    def cp(state, x):
        xl, pl = context.to_layout(x, layout), context.to_layout(positions, layout)
        y = context.from_layout(context.cca_forward(nnx.merge(graphdef, state), xl, pl, layout), layout)
        return jnp.sum(jnp.sin(y)), y

    mesh = _mesh(data, ctx)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, sharding.batch_spec(3)))
        grads, y = jax.jit(jax.grad(cp, argnums=(0, 1), has_aux=True))(state, xs)
    assert rel_err(y, ref_y) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, f"{layout} {data}x{ctx}")


def test_layout_permutation_and_positions():
    mesh = _mesh(2, 4)
    ids = np.arange(2 * 32, dtype=np.int32).reshape(2, 32)
    with jax.set_mesh(mesh):
        ids_s = jax.device_put(ids, NamedSharding(mesh, sharding.batch_spec(2)))
        zig = jax.jit(lambda a: context.to_layout(a, "zigzag"))(ids_s)
        back = jax.jit(lambda a: context.from_layout(a, "zigzag"))(zig)
    # 8 chunks of 4 tokens in the order 0, 7, 1, 6, 2, 5, 3, 4 along the sequence axis
    order = [0, 7, 1, 6, 2, 5, 3, 4]
    np.testing.assert_array_equal(np.asarray(zig), ids.reshape(2, 8, 4)[:, order].reshape(2, 32))
    np.testing.assert_array_equal(np.asarray(back), ids)
    np.testing.assert_array_equal(context.layout_positions(32, 4, "zigzag")[0], np.asarray(zig)[0])
    np.testing.assert_array_equal(context.layout_positions(32, 4, "contiguous")[0], np.arange(32))


def test_no_mesh_or_indivisible_sequence_uses_plain_cca():
    assert context.active_layout(4, 1024, "zigzag", 2) is None  # no mesh
    with jax.set_mesh(_mesh(4, 2)):
        assert context.active_layout(4, 1024, "zigzag", 2) == "zigzag"
        assert context.active_layout(4, 1022, "zigzag", 2) is None  # 1022 % 4
        assert context.active_layout(3, 1024, "contiguous", 2) is None  # batch over 4 data shards
        assert context.active_layout(4, 2, "contiguous", 2) is None  # one token per chunk < halo 2


# ----------------------------------------------------------------------------- full model, loss and gradients


def _config(data: int, ctx: int, expert: int, dispatch: str = "ep", layout: str = "contiguous"):
    config = tiny_config(num_experts=8, dispatch=dispatch, capacity_factor=8.0)  # cf = E: nothing dropped
    config.mesh.update(dict(data=data, context=ctx, expert=expert, context_layout=layout))
    config.train.seq_len = SEQ
    config.train.global_batch_size = BATCH
    return validate(config)


def _loss_and_grads(config, devices):
    return mean_loss_and_grads(config, devices, random_batch(BATCH, SEQ, config.model.vocab_size))


@pytest.fixture(scope="module")
def reference():
    """One device, dense one-hot dispatch, no context axis: the plain full-sequence CCA."""
    return _loss_and_grads(_config(1, 1, 1, "dense"), jax.devices()[:1])


@pytest.mark.parametrize(
    "data,ctx,expert,layout",
    [
        # data × context, context × expert, all-context zigzag (the CCA layer test covers 4 × 2 and 1 × 8 contiguous)
        (2, 4, 1, "contiguous"),
        (1, 2, 4, "contiguous"),
        (1, 8, 1, "zigzag"),
    ],
)
def test_loss_and_grads_match_single_device(reference, data, ctx, expert, layout):
    ref_loss, ref_grads, ref_counts, _ = reference
    loss, grads, counts, dropped = _loss_and_grads(_config(data, ctx, expert, layout=layout), jax.devices())
    assert rel_err(loss, ref_loss) <= 1e-5
    assert_trees_close(grads, ref_grads, 1e-5, f"mesh {data}x{ctx}x{expert} {layout}")
    np.testing.assert_array_equal(counts, ref_counts)
    assert int(np.sum(dropped)) == 0


# ----------------------------------------------------------------------------- compiled collectives


def _all_gather_shapes(hlo: str) -> list[tuple[int, ...]]:
    shapes = []
    for line in hlo.splitlines():
        if "all-gather(" not in line and "all-gather-start(" not in line:
            continue
        result = line.split("=", 1)[1].split("all-gather", 1)[0]
        shapes += [tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"\[([\d,]+)\]", result)]
    return shapes


@pytest.mark.parametrize("layout", CONTEXT_LAYOUTS)
def test_hlo_permutes_halos_and_gathers_only_compressed_kv(layout):
    """Loss and gradients of the model (abstract state, nothing allocated) on a 2 data x 4 context mesh."""
    config = _config(2, 4, 1, layout=layout)
    m = config.model
    mesh = make_mesh(config)
    graphdef, state, _ = abstract_train_state(config, mesh, make_optimizer(config))
    batch_sh = NamedSharding(mesh, sharding.batch_spec(2))
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh)
        for k, v in random_batch(BATCH, SEQ, m.vocab_size).items()
    }
    fn = jax.jit(lambda p, b, batch: loss_and_grads(graphdef, p, b, batch, config))
    with jax.set_mesh(mesh):
        hlo = fn.lower(state.params, state.biases, batch).compile().as_text()
    assert re.search(r"\bcollective-permute(-start)?\(", hlo), "halos move with collective-permute"
    shapes = _all_gather_shapes(hlo)
    kv = (m.num_kv_heads, m.head_dim)
    assert any(s[-2:] == kv and SEQ // 4 in s for s in shapes), f"K/V all-gather over context missing: {shapes}"
    # nothing gathers the sequence of uncompressed activations (hidden / query / packed / vocab width)
    wide = {m.hidden_size, m.num_q_heads * m.head_dim, (m.num_q_heads + m.num_kv_heads) * m.head_dim, m.vocab_size}
    local_batch = BATCH // 2
    for s in shapes:
        tokens = int(np.prod(s[:-1])) if len(s) > 1 else 0
        assert not (s[-1] in wide and tokens >= local_batch * SEQ), f"all-gather of full activations {s}"


# ----------------------------------------------------------------------------- config validation


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="not divisible by mesh.context=8"):
        config = tiny_config()
        config.mesh.update(dict(data=1, context=8))
        config.train.seq_len = 100
        validate(config)
    with pytest.raises(ConfigError, match=r"x 2 \(zigzag"):
        config = tiny_config()
        config.mesh.update(dict(data=1, context=4, context_layout="zigzag"))
        config.train.seq_len = 36  # divisible by 4, not by 8
        validate(config)
    with pytest.raises(ConfigError, match="conv halo"):
        config = tiny_config()
        config.mesh.update(dict(data=1, context=8, context_layout="zigzag"))
        config.train.seq_len = 16  # 16 chunks of 1 token
        validate(config)
    with pytest.raises(ConfigError, match="context_layout"):
        config = tiny_config()
        config.mesh.context_layout = "striped"
        validate(config)
