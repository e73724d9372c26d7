"""The micro-batch loop that every train step runs: gradients and totals summed over micro-batches.

`accumulate` splits the global batch into `train.microbatches` micro-batches and runs one `lax.scan` over them:
each micro-batch's forward/backward adds its gradients to an fp32 accumulator, and its loss sums and router
statistics to `Totals`. One micro-batch is the same loop run once: XLA removes a one-trip loop (the compiled
tiny GSPMD step has the same loops and instruction count as a step without it). How a
gradient is summed is the caller's: the GSPMD step (`zaya_jax.train.step`) adds parameter-shaped trees, the
ZeRO-1 step (`zaya_jax.train.zero1.step`) adds into its owner layout. No collective runs per micro-batch.

The loss is a token mean over the *global* batch: summed cross-entropies and token counts are accumulated over
micro-batches (and, in ZeRO-1, over devices) and divided once at the end, so the result does not depend on the
micro-batch split or the mesh (up to float reduction order). At the step's end `zaya_jax.train.step_metrics`
turns the totals into the balancing update and the metrics.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.model.layers import dtype_of
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import active_mesh, in_manual_region
from zaya_jax.train.loss import LossSums, chunked_objective

BATCH_KEYS = ("input_ids", "labels", "loss_mask")


class Totals(NamedTuple):
    """What a step sums over micro-batches besides gradients."""

    loss: LossSums  # Σ CE, Σ logsumexp², Σ tokens (fp32 scalars)
    counts: jax.Array  # [L, E+1] int32 tokens routed to each expert and to the skip slot
    dropped: jax.Array  # [L] int32 tokens dropped by the expert capacity
    prob_sum: jax.Array  # [L, E+1] fp32 router probabilities summed over the tokens
    prob_dev_sq_sum: jax.Array  # [L, E+1] fp32 Σ (p − 1/(E+1))² over the tokens

    @classmethod
    def zeros(cls, config: ml_collections.ConfigDict) -> Totals:
        m = config.model
        return cls(
            LossSums(*(jnp.zeros((), jnp.float32),) * 3),
            jnp.zeros((m.num_layers, m.num_experts + 1), jnp.int32),
            jnp.zeros((m.num_layers,), jnp.int32),
            jnp.zeros((m.num_layers, m.num_experts + 1), jnp.float32),
            jnp.zeros((m.num_layers, m.num_experts + 1), jnp.float32),
        )

    def plus(self, sums: LossSums, stats) -> Totals:
        """These totals with one more micro-batch's LossSums and MoEStats added."""
        loss = jax.tree.map(jnp.add, self.loss, sums)
        return Totals(
            loss,
            self.counts + stats.counts,
            self.dropped + stats.dropped,
            self.prob_sum + stats.prob_sum,
            self.prob_dev_sq_sum + stats.prob_dev_sq_sum,
        )


def micro_split(batch: dict, microbatches: int) -> dict:
    """[B, S] arrays → [mb, B/mb, S] (micro-batch k = rows k, k+mb, …, so each stays spread over devices)."""

    def split(x):
        x = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return {k: split(batch[k]) for k in BATCH_KEYS}


def context_blocks() -> int:
    """Blocks of the sequence dim that live on different devices under the active GSPMD mesh (its context axis)."""
    mesh = active_mesh()
    return 1 if mesh is None or in_manual_region() else int(mesh.shape["context"])


def micro_loss(graphdef, params, biases, mb: dict, config: ml_collections.ConfigDict, run_layers=None):
    """(summed objective, (LossSums, MoEStats)) of one (micro)batch {input_ids, labels, loss_mask: [b, S]};
    differentiate w.r.t. `params`. run_layers: how the layer stack runs (`Zaya.hidden_states`)."""
    model = nnx.merge(graphdef, params, biases)
    h, stats = model.hidden_states(
        sharding.constrain_batch(mb["input_ids"]), context_layout=config.mesh.context_layout, run_layers=run_layers
    )
    total, sums = chunked_objective(
        h,
        model.embed[...],
        mb["labels"],
        mb["loss_mask"],
        z_loss=config.train.z_loss,
        chunk=config.train.loss_chunk,
        blocks=context_blocks(),
        dtype=dtype_of(config.model.dtype),
        matmul=model.kernels.matmul,
    )
    return total, (sums, stats)


def fp32_zeros(tree: Any) -> Any:
    """An fp32 accumulator shaped like `tree` (arrays or ShapeDtypeStructs)."""
    return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)


def add_fp32(acc: Any, grads: Any) -> Any:
    """acc + grads, leaf by leaf, in fp32 (grads may be in the compute dtype)."""
    return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)


AddGrads = Callable[[Any, dict], tuple[Any, tuple[LossSums, Any]]]


def accumulate(
    add_grads: AddGrads, zeros: Any, batch: dict, config: ml_collections.ConfigDict, add_last: AddGrads | None = None
) -> tuple[Any, Totals]:
    """Gradients and totals summed over the micro-batches of `batch` ({input_ids, labels, loss_mask: [B, S]}).

    add_grads(acc, micro_batch) -> (acc + that micro-batch's gradients, (LossSums, MoEStats)), scanned over the
    micro-batches from `zeros` (the fp32 accumulator). add_last: the function for the last micro-batch when it
    differs (ZeRO-1's backward pass that reduce-scatters as it goes); the scan then covers the others (none
    with one micro-batch). Returns (accumulated gradients, Totals)."""

    def body(add: AddGrads):
        def step(carry, mb):
            acc, totals = carry
            acc, (sums, stats) = add(acc, mb)
            return (acc, totals.plus(sums, stats)), None

        return step

    micro = micro_split(batch, config.train.microbatches)
    carry = (zeros, Totals.zeros(config))
    if add_last is None:
        return jax.lax.scan(body(add_grads), carry, micro)[0]
    carry, _ = jax.lax.scan(body(add_grads), carry, jax.tree.map(lambda x: x[:-1], micro))
    return body(add_last)(carry, jax.tree.map(lambda x: x[-1], micro))[0]
