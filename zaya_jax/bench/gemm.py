"""GEMM microbenchmarks: achieved FLOP/s = 2MNK / t (docs/benchmarks.md).

Sweeps (each row is `[M,K] x [K,N]` in one dtype, output in the same dtype, fp32 accumulation
by the backend):
  * square   M = N = K over a size list;
  * model    the ZAYA1 GEMMs at T tokens per device and T_e tokens per expert
             (`zaya_shapes`; T is the knob that scales them down on CPU);
  * unaligned  off-by-one sizes around aligned bases (2047/2048/2049 …) to expose alignment cliffs;
  * grouped  expert GEMM `[T,H] x [E,H,I]`: `jax.lax.ragged_dot` vs a padded batched einsum
             `[E,C,H] x [E,H,I]` with C = T/E (balanced routing). Both report useful FLOP/s
             2·T·H·I / t. On XLA:CPU ragged_dot is a masked dense dot doing E x the work
             (on CPU, XLA lowers `ragged_dot` to a dense masked dot).
`measure_gemm_peak` is the ceiling of the train benchmark's MFU; on a machine the hardware table
(`zaya_jax.hardware`) does not know, the square sweep's best TFLOP/s is the value for `train.peak_tflops`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from zaya_jax.bench import common
from zaya_jax.config import model_config

GPU_SQUARE = (256, 512, 1024, 2048, 4096, 8192, 16384)
CPU_SQUARE = (128, 256, 512, 1024)
CPU_MAX_GFLOP = 20.0  # default per-shape cap on CPU (the full LM head at T=256 is 275 GFLOP)


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of `[m,k] x [k,n]` (one multiply + one add per MAC)."""
    return 2 * m * n * k


def _operands(m: int, n: int, k: int, dtype: Any, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    return common.randn((m, k), dtype, seed), common.randn((k, n), dtype, seed + 1)


@jax.jit
def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """Operands in their dtype, fp32 accumulation and output (as every matmul of the training step)."""
    return jnp.matmul(a, b, preferred_element_type=jnp.promote_types(a.dtype, jnp.float32))


def time_gemm(m: int, n: int, k: int, dtype: Any, warmup: int = 2, trials: int = 5) -> common.Timing:
    """Wall time of one `[m,k] x [k,n]` GEMM (inputs created on the default device)."""
    a, b = _operands(m, n, k, jnp.dtype(dtype))
    return common.time_fn(_matmul, a, b, warmup=warmup, trials=trials)


def measure_gemm_peak(dtype: Any = None, size: int | None = None, warmup: int = 2, trials: int = 5) -> float:
    """Best achieved FLOP/s of a square `size`^3 GEMM (min time over trials).

    Defaults: dtype bf16 on accelerators / f32 on CPU; size 8192 on accelerators / 1024 on CPU.
    The achievable ceiling that the MFU of the peer comparisons (`python -m benchmarks.peers`, from a checkout)
    is measured against.
    """
    dtype = jnp.dtype(dtype or common.default_float_dtype())
    if size is None:
        size = 1024 if jax.default_backend() == "cpu" else 8192
    t = time_gemm(size, size, size, dtype, warmup, trials)
    return gemm_flops(size, size, size) / t.min


def zaya_shapes(
    model_cfg: Any = None, tokens: int = 4096, tokens_per_expert: int | None = None
) -> list[tuple[str, int, int, int]]:
    """ZAYA1 GEMMs as (name, M, N, K) for `[M,K] x [K,N]` (§6 (b)).

    `model_cfg`: a ConfigDict like `zaya_jax.config.model_config()` (default: ZAYA1-base).
    `tokens` = T per device; `tokens_per_expert` = T_e (default T·top_k / num_experts).
    """
    if model_cfg is None:
        model_cfg = model_config()
    h, hd = int(model_cfg.hidden_size), int(model_cfg.head_dim)
    nq, nkv = int(model_cfg.num_q_heads), int(model_cfg.num_kv_heads)
    inter, e = int(model_cfg.moe_intermediate_size), int(model_cfg.num_experts)
    topk = int(model_cfg.num_experts_per_tok)
    te = tokens_per_expert or max(1, tokens * topk // e)
    t = tokens
    return [
        ("q", t, nq * hd, h),
        ("k", t, nkv * hd, h),
        ("v", t, nkv * hd // 2, h),  # CCA value projection: current / delayed halves
        ("o", t, h, nq * hd),
        ("router", t, int(model_cfg.router_hidden_size), h),
        ("expert_gate_up", te, 2 * inter, h),
        ("expert_down", te, h, inter),
        ("head", t, int(model_cfg.vocab_size), h),
    ]


def unaligned_shapes(bases: Sequence[int] = (2048,)) -> list[tuple[str, int, int, int]]:
    """Square b-1 / b / b+1 and K-only b±1 variants for each aligned base b (§6 (c))."""
    shapes = []
    for b in bases:
        for s in (b - 1, b, b + 1):
            shapes.append((f"{s}^3", s, s, s))
        for s in (b - 1, b + 1):
            shapes.append((f"{b}x{b}xK{s}", b, b, s))
    return shapes


def _gemm_row(
    sweep: str, name: str, m: int, n: int, k: int, dtype: Any, warmup: int, trials: int, max_gflop: float | None
) -> dict[str, Any]:
    flops = gemm_flops(m, n, k)
    row: dict[str, Any] = dict(sweep=sweep, name=name, M=m, N=n, K=k, dtype=jnp.dtype(dtype).name, gflop=flops / 1e9)
    if max_gflop is not None and flops / 1e9 > max_gflop:
        row["skipped"] = f"> max_gflop={max_gflop}"
        return row
    t = time_gemm(m, n, k, dtype, warmup, trials)
    row.update(
        median_s=t.median, min_s=t.min, tflops=flops / t.median / 1e12, tflops_best=flops / t.min / 1e12, skipped=""
    )
    return row


def grouped_rows(
    tokens: int, hidden: int, inter: int, experts: int, dtype: Any, warmup: int = 2, trials: int = 5
) -> list[dict[str, Any]]:
    """ragged_dot `[T,H] x [E,H,I]` vs padded einsum `[E,C,H] x [E,H,I]`, balanced groups (§6 (d))."""
    dtype = jnp.dtype(dtype)
    cap = math.ceil(tokens / experts)
    lhs = common.randn((tokens, hidden), dtype, 1)
    rhs = common.randn((experts, hidden, inter), dtype, 2)
    sizes = [tokens // experts + (1 if i < tokens % experts else 0) for i in range(experts)]
    group_sizes = jnp.asarray(sizes, jnp.int32)
    padded = common.randn((experts, cap, hidden), dtype, 3)

    ragged = jax.jit(lambda x, w, g: jax.lax.ragged_dot(x, w, g, preferred_element_type=dtype))
    einsum = jax.jit(lambda x, w: jnp.einsum("ech,ehi->eci", x, w, preferred_element_type=dtype))
    useful = gemm_flops(tokens, inter, hidden)
    rows = []
    for name, fn, args, executed in (
        ("ragged_dot", ragged, (lhs, rhs, group_sizes), useful),
        ("padded_einsum", einsum, (padded, rhs), gemm_flops(experts * cap, inter, hidden)),
    ):
        t = common.time_fn(fn, *args, warmup=warmup, trials=trials)
        rows.append(
            dict(
                sweep="grouped",
                name=name,
                M=tokens,
                N=inter,
                K=hidden,
                experts=experts,
                capacity=cap,
                dtype=dtype.name,
                gflop=useful / 1e9,
                executed_gflop=executed / 1e9,
                median_s=t.median,
                min_s=t.min,
                tflops=useful / t.median / 1e12,
                tflops_best=useful / t.min / 1e12,
                skipped="",
            )
        )
    return rows


def benchmark(
    dtype: Any = None,
    square: Sequence[int] | None = None,
    tokens: int | None = None,
    tokens_per_expert: int | None = None,
    unaligned_bases: Sequence[int] | None = None,
    grouped: tuple[int, int, int, int] | None = None,
    model_cfg: Any = None,
    warmup: int = 2,
    trials: int = 5,
    max_gflop: float | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """All four sweeps; `grouped` = (T, H, I, E). Defaults depend on the backend (CPU: small sizes and
    shapes above `CPU_MAX_GFLOP` skipped; pass `max_gflop` to override). Rows of skipped shapes
    carry `skipped`."""
    cpu = jax.default_backend() == "cpu"
    dtype = jnp.dtype(dtype or common.default_float_dtype())
    square = square if square is not None else (CPU_SQUARE if cpu else GPU_SQUARE)
    tokens = tokens or (256 if cpu else 8192)
    unaligned_bases = unaligned_bases if unaligned_bases is not None else ((512,) if cpu else (2048, 8192))
    grouped = grouped or ((512, 256, 512, 8) if cpu else (16384, 2048, 4096, 16))
    if max_gflop is None and cpu:
        max_gflop = CPU_MAX_GFLOP
    rows = []
    for s in square:
        rows.append(_gemm_row("square", f"{s}^3", s, s, s, dtype, warmup, trials, max_gflop))
    for name, m, n, k in zaya_shapes(model_cfg, tokens, tokens_per_expert):
        rows.append(
            _gemm_row(
                "model",
                f"{name}[T={tokens}]" if not name.startswith("expert") else f"{name}[Te={m}]",
                m,
                n,
                k,
                dtype,
                warmup,
                trials,
                max_gflop,
            )
        )
    for name, m, n, k in unaligned_shapes(unaligned_bases):
        rows.append(_gemm_row("unaligned", name, m, n, k, dtype, warmup, trials, max_gflop))
    if log:
        log(f"gemm: square/model/unaligned sweeps done ({len(rows)} shapes)")
    rows.extend(grouped_rows(*grouped, dtype=dtype, warmup=warmup, trials=trials))
    return rows


def plot(rows: Sequence[dict[str, Any]], path: str) -> list[str]:
    """Square sweep as a line; model / unaligned / grouped sweeps as bars (TFLOP/s, median); returns the file
    names written."""
    done = [r for r in rows if not r.get("skipped")]
    sq = [r for r in done if r["sweep"] == "square"]
    title = f"GEMM TFLOP/s = 2MNK/t on {common.device_description()}"
    base, ext = os.path.splitext(path)
    common.plot_panels(
        base + "_square" + ext,
        {
            "square M=N=K": {
                "median": ([r["M"] for r in sq], [r["tflops"] for r in sq]),
                "best": ([r["M"] for r in sq], [r["tflops_best"] for r in sq]),
            }
        },
        xlabel="M = N = K",
        ylabel="TFLOP/s",
        title=title,
        xfmt=lambda v: f"{v:.0f}",
    )
    bars = {}
    for sweep in ("square", "model", "unaligned", "grouped"):
        sel = [r for r in done if r["sweep"] == sweep]
        if sel:
            bars[sweep] = {
                "median": [(r["name"], r["tflops"]) for r in sel],
                "best": [(r["name"], r["tflops_best"]) for r in sel],
            }
    common.plot_bars(path, bars, ylabel="TFLOP/s", title=title)
    return [os.path.basename(base + "_square" + ext), os.path.basename(path)]


def run(out_dir: str, *, command: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Benchmark (kwargs as `benchmark`), reported as gemm.csv / gemm.md / gemm.png / gemm_square.png."""
    rows = benchmark(log=common.say, **kwargs)
    return common.report(
        out_dir,
        "gemm",
        rows,
        title="GEMM throughput",
        table_columns=["sweep", "name", "M", "N", "K", "dtype", "median_s", "tflops", "tflops_best", "skipped"],
        notes=[
            "TFLOP/s = 2*M*N*K / t (t = median; tflops_best uses the min); grouped rows count "
            "useful FLOPs 2*T*H*I for both paths"
        ],
        plots=lambda d: plot(rows, os.path.join(d, "gemm.png")),
        command=command,
    )
