"""MoE block vs a dense SwiGLU block of equal active FLOPs, per dispatch implementation (forward + backward).

The MoE block is the model's `MoE` module (router + dispatch + experts, `zaya_jax.model.moe`) on T tokens
x [T, H]. Its active matmul FLOPs per token are the router (H·R + 2R² + R·(E+1)) plus one SwiGLU expert
(3·H·I). The dense baseline is one SwiGLU MLP of width I_d = I + round(router / (3H)), i.e. the same active
FLOPs, with no routing. Each row times `jax.grad` w.r.t. all parameters and x (forward + backward),
jitted, median over trials; `ratio_vs_dense` = MoE time / dense time measured in the same run.

`ep` runs on a mesh of `ep_devices` devices (expert axis) and its dense baseline runs data-parallel on the
same devices; every other dispatch runs on one device. A row's `dispatch` is `model.dispatch`, with the
grouped-GEMM kernel after a colon for `dropless` (`dropless:loops`, `dropless:ragged_dot`, docs/kernels.md).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zaya_jax import kernels
from zaya_jax.bench import common
from zaya_jax.model.moe import MoE, capacity
from zaya_jax.model.zaya import frozen
from zaya_jax.parallel.mesh import AXES

COLUMNS = (
    "dispatch",
    "devices",
    "tokens",
    "hidden",
    "experts",
    "expert_width",
    "dense_width",
    "capacity_factor",
    "moe_s_median",
    "moe_s_min",
    "dense_s_median",
    "ratio_vs_dense",
    "expert_work_factor",
    "dropped_fraction",
    "active_gflop",
)
# every concrete dispatch (dropless once per CPU-runnable grouped-GEMM kernel); the two that do E x the expert
# work on CPU last: their [E, T, ...] buffers left the rows after them slower in the same process (dropless:loops
# 164 ms after them, 135 ms before, one host)
DISPATCHES = ("dropless:loops", "capacity", "ep", "dropless:ragged_dot", "dense")


def with_dispatch(m: ml_collections.ConfigDict, dispatch: str) -> ml_collections.ConfigDict:
    """A copy of model config `m` running `dispatch` ("dropless:<grouped-GEMM kernel>" or a dispatch name)."""
    name, _, kernel = dispatch.partition(":")
    cfg = ml_collections.ConfigDict(m.to_dict())
    cfg.dispatch = name
    if kernel:
        cfg.kernels.grouped_gemm = kernel
    return cfg


def active_flops_per_token(m: ml_collections.ConfigDict) -> tuple[int, int]:
    """(router, one expert) forward matmul FLOPs per token."""
    h, r, e, i = m.hidden_size, m.router_hidden_size, m.num_experts, m.moe_intermediate_size
    return 2 * (h * r + 2 * r * r + r * (e + 1)), 2 * 3 * h * i


def dense_width(m: ml_collections.ConfigDict) -> int:
    router, expert = active_flops_per_token(m)
    return int(round((router + expert) / (2 * 3 * m.hidden_size)))


def swiglu_params(h: int, i: int, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    return {
        "w_in": jnp.asarray(0.02 * rng.standard_normal((h, 2 * i), np.float32)),
        "w_out": jnp.asarray(0.02 * rng.standard_normal((i, h), np.float32)),
    }


def dense_swiglu(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """x [T, H] → [T, H] through one SwiGLU MLP (gate | up fused in w_in [H, 2I])."""
    gate, up = jnp.split(x @ p["w_in"], 2, axis=-1)
    return (jax.nn.silu(gate) * up) @ p["w_out"]


def _grad_fn(f):
    return jax.jit(jax.grad(lambda p, x, c: jnp.vdot(f(p, x), c), argnums=(0, 1)))


def time_moe(
    m: ml_collections.ConfigDict, tokens: int, dispatch: str, devices: Sequence, warmup: int, trials: int
) -> dict[str, Any]:
    """Time the MoE block (fwd+bwd) and its equal-FLOPs dense baseline on `devices`."""
    mm = frozen(with_dispatch(m, dispatch))
    moe = MoE(mm, kernels.resolve(mm), rngs=nnx.Rngs(params=0))
    graphdef, params, rest = nnx.split(moe, nnx.Param, ...)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((1, tokens, m.hidden_size), np.float32))
    cot = jnp.asarray(rng.standard_normal((1, tokens, m.hidden_size), np.float32))
    state = jnp.zeros((1, tokens, m.router_hidden_size), jnp.float32)
    n = len(devices)
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(1, 1, n), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    tok = NamedSharding(mesh, P(None, "expert"))  # tokens split over the devices
    x, cot, state = (jax.device_put(a, tok) for a in (x, cot, state))
    params = jax.device_put(params, NamedSharding(mesh, P()))
    dense_p = jax.device_put(swiglu_params(m.hidden_size, dense_width(m)), NamedSharding(mesh, P()))

    def moe_out(p, xx):
        out, _, stats = nnx.merge(graphdef, p, rest)(xx, state)
        return out

    stats_fn = jax.jit(lambda p, xx: nnx.merge(graphdef, p, rest)(xx, state)[2])
    moe_grad = _grad_fn(moe_out)
    dense_grad = _grad_fn(lambda p, xx: dense_swiglu(p, xx.reshape(-1, xx.shape[-1])).reshape(xx.shape))
    with jax.set_mesh(mesh):
        stats = jax.device_get(stats_fn(params, x))
        t_moe = common.time_fn(moe_grad, params, x, cot, warmup=warmup, trials=trials)
        t_dense = common.time_fn(dense_grad, dense_p, x, cot, warmup=warmup, trials=trials)
    expert_tokens = int(np.sum(stats.counts[:-1]))
    router, expert = active_flops_per_token(m)
    work = {
        "dense": float(m.num_experts),
        # XLA:CPU lowers ragged_dot to a dense masked dot; XLA's GPU lowerings vary (docs/kernels.md)
        "dropless:ragged_dot": float(m.num_experts) if kernels.current_platform() == "cpu" else float("nan"),
        "capacity": m.num_experts * capacity(tokens, m.num_experts, m.capacity_factor) / tokens,
        "ep": m.num_experts * capacity(tokens // n, m.num_experts, m.capacity_factor) / (tokens // n),
        "dropless:loops": float(np.sum(-(-np.asarray(stats.counts[:-1]) // 16) * 16)) / tokens,
    }  # rows rounded to 16
    return dict(
        dispatch=dispatch,
        devices=n,
        tokens=tokens,
        hidden=m.hidden_size,
        experts=m.num_experts,
        expert_width=m.moe_intermediate_size,
        dense_width=dense_width(m),
        capacity_factor=m.capacity_factor,
        moe_s_median=t_moe.median,
        moe_s_min=t_moe.min,
        dense_s_median=t_dense.median,
        ratio_vs_dense=common.ratio(t_moe.median, t_dense.median),
        expert_work_factor=work.get(dispatch, float("nan")),
        dropped_fraction=common.ratio(float(stats.dropped), max(expert_tokens, 1)),
        active_gflop=3 * tokens * (router + expert) / 1e9,
    )


def benchmark(
    m: ml_collections.ConfigDict,
    tokens: int,
    dispatches: Sequence[str] = DISPATCHES,
    capacity_factors: Sequence[float] = (),
    ep_devices: int | None = None,
    warmup: int = 1,
    trials: int = 3,
    log=print,
) -> list[dict[str, Any]]:
    """One row per dispatch (capacity / ep once per capacity factor in `capacity_factors`, default the config's)."""
    rows = []
    cfs = list(capacity_factors) or [float(m.capacity_factor)]
    for dispatch in dispatches:
        for cf in cfs if dispatch in ("capacity", "ep") else [float(m.capacity_factor)]:
            mm = ml_collections.ConfigDict(m.to_dict())
            mm.capacity_factor = cf
            n = 1
            if dispatch == "ep":
                n = ep_devices or max(d for d in (1, 2, 4, 8, 16) if d <= jax.device_count() and m.num_experts % d == 0)
            row = time_moe(mm, tokens, dispatch, jax.devices()[:n], warmup, trials)
            log(
                f"moe: {dispatch} cf={cf:g} devices={n}: {row['moe_s_median'] * 1e3:.1f} ms vs dense "
                f"{row['dense_s_median'] * 1e3:.1f} ms -> {row['ratio_vs_dense']:.2f}x"
            )
            rows.append(row)
    return rows


def run(
    out_dir: str, m: ml_collections.ConfigDict, tokens: int, *, command: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    """`benchmark(...)` reported as moe.csv / moe.md."""
    rows = benchmark(m, tokens, log=common.say, **kwargs)
    cols = [
        "dispatch",
        "devices",
        "capacity_factor",
        "moe_s_median",
        "dense_s_median",
        "ratio_vs_dense",
        "expert_work_factor",
        "dropped_fraction",
    ]
    best = min(rows, key=lambda r: r["ratio_vs_dense"])
    geometry = (
        f"T={tokens} tokens, hidden {m.hidden_size}, {m.num_experts} experts of width "
        f"{m.moe_intermediate_size}, router {m.router_hidden_size}; dense baseline width "
        f"{dense_width(m)} (equal active FLOPs incl. the router); forward + backward, f32"
    )
    dropless = "dropless:" + kernels.resolve(m).grouped_gemm  # what `auto` runs on one device here
    summary = [f"{r['ratio_vs_dense']:.2f}x" for r in rows if r["dispatch"] == dropless]
    result = common.report(
        out_dir,
        "moe",
        rows,
        title="MoE block vs dense SwiGLU of equal active FLOPs",
        table_columns=cols,
        csv_columns=COLUMNS,
        sections=[("Setup", geometry + "\n\n" + __doc__.split("\n\n", 1)[1])],
        notes=[
            f"best dispatch: {best['dispatch']} (capacity factor {best['capacity_factor']:g}): "
            f"{best['ratio_vs_dense']:.2f}x the dense block",
            *(f"dropless ({dropless}, what `auto` runs on one device here) / dense: {x}" for x in summary),
        ],
        command=command,
    )
    for x in summary:
        common.say(f"dropless / dense: {x}")
    return result
