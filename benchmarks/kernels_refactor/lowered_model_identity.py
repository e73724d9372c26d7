"""Lowered fwd+bwd of the 100M model alone (no optimizer) on one CPU device, fp32 and bf16, normalised names."""
import os, re, sys
os.environ["JAX_PLATFORMS"] = "cpu"
src, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, src); os.chdir(src)
import jax, jax.numpy as jnp
from flax import nnx
from zaya_jax.config import load_config
from zaya_jax.model import abstract_model
for dt in ("float32", "bfloat16"):
    cfg = load_config("experiments/zaya1_100m.py")
    cfg.model.dtype = dt
    graphdef, params, rest = nnx.split(abstract_model(cfg.model), nnx.Param, ...)
    ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    f = jax.jit(jax.grad(lambda p, r, i: jnp.sum(nnx.merge(graphdef, p, r)(i) ** 2)))
    text = f.trace(params, rest, ids).lower().as_text()
    text = re.sub(r"@([A-Za-z_]+?)_\d+\b", r"@\1", text)
    open(f"{out}.{dt}.mlir", "w").write(text)
    print(dt, len(text.splitlines()))
