"""GEMM rate of XLA:CPU per operand layout and dtype: which spellings of a projection's three GEMMs (forward
x·W, input gradient g·Wᵀ, weight gradient xᵀ·g) reach the CPU's fast bf16 path.

    python benchmarks/tools/dot_layouts.py

Prints GFLOP/s (best of 10 after a warm-up, one jitted dot each) for f32, bf16 → bf16, bf16 with f32 output
(`preferred_element_type`), and the two transposed-operand forms with f32 output.
"""

import jax
import jax.numpy as jnp

from zaya_jax.bench.common import time_fn

F32 = jnp.float32


def main() -> None:
    print(jax.devices()[0].device_kind, jax.__version__)
    for m, k, n in [(1024, 1024, 1024), (2048, 512, 1024), (128, 512, 1024)]:
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        x, w = jax.random.normal(k1, (m, k)), jax.random.normal(k2, (k, n))
        g = jax.random.normal(k3, (m, n))
        xb, wb, gb = (a.astype(jnp.bfloat16) for a in (x, w, g))
        cases = {
            "f32 x@W": (lambda a, b: a @ b, x, w),
            "bf16->bf16 x@W": (lambda a, b: a @ b, xb, wb),
            "bf16->f32 x@W": (lambda a, b: jnp.matmul(a, b, preferred_element_type=F32), xb, wb),
            "bf16->f32 g@W^T": (lambda a, b: jnp.matmul(a, b.T, preferred_element_type=F32), gb, wb),
            "bf16->f32 x^T@g": (lambda a, b: jnp.matmul(a.T, b, preferred_element_type=F32), xb, gb),
        }
        flop = 2 * m * k * n / 1e9
        rates = {name: flop / time_fn(jax.jit(f), a, b, warmup=1, trials=10).min for name, (f, a, b) in cases.items()}
        print(f"{m}x{k}x{n}: " + "  ".join(f"{name} {r:.0f}" for name, r in rates.items()) + " GFLOP/s")


if __name__ == "__main__":
    main()
