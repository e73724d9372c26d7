"""The sharding rules (`zaya_jax.parallel.sharding`): the PartitionSpec of every parameter and of every
per-parameter optimizer-state leaf of the tiny model on a data:2 × context:2 × expert:2 mesh.

Expected specs are written out by hand from the rules stated in docs/parallelism.md (routed experts over
`expert`; `fsdp` also splits the hidden dimension over `data`; optimizer state spreads every unused mesh
axis over the first dimension that stays divisible, leading dimensions first, then the larger matrix
dimension), not computed by the code under test. Pure shape logic: no array is allocated.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from tests.tools.helpers import tiny_config
from zaya_jax.keys import path_name
from zaya_jax.model.zaya import abstract_model
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import make_mesh

DCE = ("data", "context", "expert")

# (param spec zero1/replicated, param spec fsdp, optimizer-state spec zero1, optimizer-state spec fsdp)
EXPECTED = {
    # [V=384, H=64]
    "embed": (P(None, None), P(None, "data"), P(DCE, None), P(("context", "expert"), "data")),
    # [H]
    "final_norm/scale": (P(None), P("data"), P(DCE), P(("data", "context", "expert"))),
    # [L=2, kv_groups=2]: data on L; context fits only the second dim; expert fits nowhere
    "layers/attn/temp": (P(None, None), P(None, None), P("data", "context"), P("data", "context")),
    # [L=2, taps=2, 96]: data on L, then the larger matrix dim (96) takes context and expert
    "layers/attn/conv1_w": (
        P(None, None, None),
        P(None, None, None),
        P("data", None, ("context", "expert")),
        P("data", None, ("context", "expert")),
    ),
    # [L=2, H=64, q=64]
    "layers/attn/wq": (
        P(None, None, None),
        P(None, "data", None),
        P("data", ("context", "expert"), None),
        P("context", ("data", "expert"), None),
    ),
    # [L=2, q=64, H=64]: fsdp puts data on the hidden (last) dim
    "layers/attn/wo": (
        P(None, None, None),
        P(None, None, "data"),
        P("data", ("context", "expert"), None),
        P("context", "expert", "data"),
    ),
    # [L=2, E=4, H=64, 2I=128]: experts over expert; the rest spreads on L then E
    "layers/moe/w_in": (
        P(None, "expert", None, None),
        P(None, "expert", "data", None),
        P("data", ("expert", "context"), None, None),
        P("context", "expert", "data", None),
    ),
    # [L=2, E=4, I=64, H=64]
    "layers/moe/w_out": (
        P(None, "expert", None, None),
        P(None, "expert", None, "data"),
        P("data", ("expert", "context"), None, None),
        P("context", "expert", None, "data"),
    ),
    # [L=2, R=16, classes=5]
    "layers/moe/router/w3": (
        P(None, None, None),
        P(None, None, None),
        P("data", ("context", "expert"), None),
        P("data", ("context", "expert"), None),
    ),
}


def _named_leaves(tree):
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return {path_name(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_var)}


@pytest.fixture(scope="module")
def setup():
    config = tiny_config()
    config.mesh.data, config.mesh.context, config.mesh.expert = 2, 2, 2
    mesh = make_mesh(config)
    params = nnx.state(abstract_model(config.model), nnx.Param)
    return mesh, params


def _norm(spec: P) -> tuple:
    """Specs compare equal whatever the spelling of one axis ('a' vs ('a',)) or trailing Nones."""
    out = [tuple(e) if isinstance(e, tuple) else ((e,) if e else ()) for e in spec]
    while out and out[-1] == ():
        out.pop()
    return tuple(out)


@pytest.mark.parametrize(
    "mode,kind,col",
    [("zero1", "param", 0), ("replicated", "param", 0), ("fsdp", "param", 1), ("zero1", "opt", 2), ("fsdp", "opt", 3)],
)
def test_specs_of_listed_leaves(setup, mode, kind, col):
    mesh, params = setup
    specs = _named_leaves(sharding.tree_specs(params, mesh, mode, kind))
    for name, expected in EXPECTED.items():
        assert _norm(specs[name].get_value()) == _norm(expected[col]), (name, mode, kind)


@pytest.mark.parametrize("mode", sharding.PARAM_MODES)
@pytest.mark.parametrize("kind", ["param", "opt"])
def test_every_leaf_gets_a_valid_spec(setup, mode, kind):
    """Every leaf: each mesh axis used at most once, every split dimension divisible; large optimizer
    leaves use every mesh axis (never replicated) except under `replicated`."""
    mesh, params = setup
    specs, leaves = _named_leaves(sharding.tree_specs(params, mesh, mode, kind)), _named_leaves(params)
    assert specs.keys() == leaves.keys()
    for name, leaf in leaves.items():
        shape, spec = leaf.get_value().shape, _norm(specs[name].get_value())
        used = [a for axes in spec for a in axes]
        assert len(used) == len(set(used)), (name, spec)
        for dim, axes in zip(shape, spec):
            assert dim % int(np.prod([mesh.shape[a] for a in axes])) == 0, (name, shape, spec)
        if kind == "opt" and mode != "replicated" and np.prod(shape) % 8 == 0 and max(shape) >= 8:
            assert sorted(used) == sorted(DCE), (name, shape, spec)
        if mode != "fsdp" and kind == "param":
            assert used == (["expert"] if "/moe/w_" in name else []), (name, spec)


def test_unnamed_leaf_is_an_error(setup):
    mesh, _ = setup
    with pytest.raises(ValueError, match="not a named parameter"):
        sharding.tree_specs({"w": jax.ShapeDtypeStruct((4, 4), np.float32)}, mesh, "zero1")
