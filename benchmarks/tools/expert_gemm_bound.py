"""A lower bound on the dropless MoE block / dense SwiGLU ratio of `launch.bench --suite=moe` from its GEMMs alone.

Times only the six GEMMs of a SwiGLU forward + backward (gate|up, down; and for the backward the input and
weight gradients of each), in fp32, jitted, on one CPU device:
  * grouped: one loop over E experts with their own weights, each taking T / E rows (perfectly balanced
    routing, one chunk per expert: the best case of `zaya_jax.kernels.grouped_loops`, no padding, no dispatch);
  * dense: the same six GEMMs on all T rows with the moe suite's equal-FLOPs width.
No router, sort, gather, scatter or activation is timed, so the grouped / dense ratio it prints is what the
per-expert GEMMs cost before any dispatch overhead: the dropless block cannot beat it with these kernels.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/tools/expert_gemm_bound.py [config] [tokens ...]

Default config experiments/zaya1_100m.py, tokens 2048 4096 16384. Prints one line per token count.
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from zaya_jax.bench import common  # noqa: E402
from zaya_jax.bench import moe as moe_bench  # noqa: E402
from zaya_jax.config import load_config  # noqa: E402


def swiglu_gemms(x, w_in, w_out, a, dy, dgu):
    """x [R,H] @ w_in [H,2I]; a [R,I] @ w_out [I,H]; and the backward's dW_out, da, dW_in, dx."""
    return (x @ w_in, a @ w_out, a.T @ dy, dy @ w_out.T, x.T @ dgu, dgu @ w_in.T)


def operands(rows: int, h: int, i: int, experts: int, seed: int = 0) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    shapes = [(rows, h), (h, 2 * i), (i, h), (rows, i), (rows, h), (rows, 2 * i)]
    return tuple(jnp.asarray(rng.standard_normal((experts, *s), np.float32)) for s in shapes)


@jax.jit
def per_expert(x, w_in, w_out, a, dy, dgu):
    """The six GEMMs for each expert in turn ([E, ...] operands, a scan over E): sums keep every output live."""

    def expert(total, ops):
        return total + sum(o.sum() for o in swiglu_gemms(*ops)), None

    return jax.lax.scan(expert, jnp.zeros((), jnp.float32), (x, w_in, w_out, a, dy, dgu))[0]


def main(config_path: str = "experiments/zaya1_100m.py", *token_counts: str) -> None:
    m = load_config(config_path).model
    h, i, e = m.hidden_size, m.moe_intermediate_size, m.num_experts
    i_dense = moe_bench.dense_width(m)
    print(f"# {config_path}: H={h}, {e} experts of width {i}, dense width {i_dense}; fp32, GEMMs only")
    for tokens in map(int, token_counts or ("2048", "4096", "16384")):
        rows = tokens // e
        grouped = common.time_fn(per_expert, *operands(rows, h, i, e), warmup=2, trials=15)
        dense = common.time_fn(per_expert, *operands(tokens, h, i_dense, 1), warmup=2, trials=15)
        gflop = 18 * tokens * h * i / 1e9  # 2·T·H·(2I + I) forward, twice that backward
        print(
            f"tokens {tokens} ({rows} rows/expert): grouped GEMMs {grouped.median * 1e3:.1f} ms "
            f"(min {grouped.min * 1e3:.1f}, {gflop / grouped.min:.0f} GFLOP/s), "
            f"dense GEMMs {dense.median * 1e3:.1f} ms (min {dense.min * 1e3:.1f}) "
            f"-> grouped / dense {grouped.median / dense.median:.2f}x "
            f"(min {grouped.min / dense.min:.2f}x)"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
