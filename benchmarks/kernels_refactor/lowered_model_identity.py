"""Write the lowered forward + backward of the 100M model (one CPU device, `auto` kernels) from a source tree.

    python benchmarks/kernels_refactor/lowered_model_identity.py SRC OUT

imports zaya_jax from SRC (e.g. a `git worktree` of an older commit) and writes OUT.float32.mlir and
OUT.bfloat16.mlir: StableHLO without debug info, the numeric suffixes of function names removed (they count
the functions traced before, which other code changes shift). Two trees that give byte-identical files compile
the model to the same program; `diff` them.
"""

from __future__ import annotations

import os
import re
import sys


def main(src: str, out: str) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, src)
    os.chdir(src)
    import jax  # imported after sys.path names the tree under test
    import jax.numpy as jnp
    from flax import nnx

    from zaya_jax.config import load_config
    from zaya_jax.model import abstract_model

    for dtype in ("float32", "bfloat16"):
        config = load_config("experiments/zaya1_100m.py")
        config.model.dtype = dtype
        graphdef, params, rest = nnx.split(abstract_model(config.model), nnx.Param, ...)
        ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)
        grad = jax.jit(jax.grad(lambda p, r, i: jnp.sum(nnx.merge(graphdef, p, r)(i) ** 2)))
        text = re.sub(r"@([A-Za-z_]+?)_\d+\b", r"@\1", grad.trace(params, rest, ids).lower().as_text())
        with open(f"{out}.{dtype}.mlir", "w") as f:
            f.write(text)
        print(dtype, len(text.splitlines()), "lines")


if __name__ == "__main__":
    main(*sys.argv[1:3])
