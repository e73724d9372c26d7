"""Router probabilities of a training checkpoint on one training batch (dense dispatch), per MoE layer: the load
CV at the checkpoint's biases, the share of the most used expert, the spread of the per-expert mean
probability across experts (a token-independent offset) against the per-token spread (std over tokens, mean
over experts), and the range of the biases (docs/balancing.md, issue 40).

    JAX_PLATFORMS=cpu python benchmarks/balancing/router_probe.py runs/demo/checkpoints 0

Like capacity_probe.py it reads the probabilities by wrapping `zaya_jax.model.router.choose` with a host
callback: an analysis hack, not library code.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from zaya_jax.checkpoint.model_io import load_model  # noqa: E402
from zaya_jax.data.pipeline import make_iterators  # noqa: E402
from zaya_jax.model import router  # noqa: E402

captured = []
choose = router.choose


def rec(p, b):
    jax.debug.callback(lambda p, b: captured.append((np.asarray(p), np.asarray(b))), p, b)
    return choose(p, b)


router.choose = rec
ckpt, step = sys.argv[1], int(sys.argv[2])
config, model = load_model(ckpt, step=step, overrides={"dispatch": "dense"})
E = config.model.num_experts
it, _, _ = make_iterators(config)
ids = it.next_batch(config.train.global_batch_size)["input_ids"]
jax.block_until_ready(model.forward(jnp.asarray(ids)).logits)
for layer, (p, b) in enumerate(captured):
    p, b = p.reshape(-1, E + 1)[:, :E], b[:E]
    c = np.bincount(np.argmax(p + b, -1), minlength=E) / len(p)
    cv = c.std() / c.mean()
    off, spread = p.mean(0), p.std(0).mean()
    print(
        f"step {step} layer {layer}: load CV {cv:.2f}, top share {c.max():.2f}, expert-mean offsets (max-min) "
        f"{off.max() - off.min():.2e}, per-token std {spread:.2e}, bias range {b.max() - b.min():.2e}"
    )
