"""What every train step does at its end, from the totals of its micro-batch loop (`zaya_jax.train.microbatch`):
the balancing controller's update from the global expert counts (arXiv 2511.17127 §4 router balancing;
`zaya_jax.train.balancing`) and the step's metrics (loss and z-loss as token means over the global batch,
gradient norm, load and dropped fractions). Shared by the GSPMD step (`zaya_jax.train.step`) and the ZeRO-1
step (`zaya_jax.train.zero1.step`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.train import balancing
from zaya_jax.train.microbatch import Totals


def balance_and_metrics(
    biases,
    bal_state,
    totals: Totals,
    grad_norm: jax.Array,
    config: ml_collections.ConfigDict,
    lr: jax.Array | None,
    step: jax.Array,
):
    """The balancing-controller update from the global counts [L, E+1] and the step's metrics; at step 0 with
    `balancing.warm_start` the biases start from the router's measured mean probabilities instead
    (`balancing.warm_start`). Returns (new biases, new controller state, metrics dict of scalars / [L] / [L, E+1]
    arrays)."""
    spread = balancing.router_spread(totals.prob_sum, totals.prob_dev_sq_sum)
    bal_metrics = balancing.load_metrics(totals.counts)
    if config.balancing.enabled:
        old = jax.tree.leaves(biases)[0]
        new_bias, new_state, bal_metrics = balancing.update_biases(bal_state, totals.counts, config.balancing)
        if config.balancing.warm_start:
            warm_bias, warm_state = balancing.warm_start(bal_state, totals.prob_sum)
            first = step == 0
            new_bias = jnp.where(first, warm_bias, new_bias)
            new_state = jax.tree.map(lambda w, u: jnp.where(first, w, u), warm_state, new_state)
            bal_metrics = {**bal_metrics, "bias": new_bias}
        bal_state = new_state
        biases = jax.tree.map(lambda _: new_bias.astype(old.dtype), biases)
    sums = totals.loss
    n = jnp.maximum(sums.tokens, 1.0)
    metrics = {
        "loss": sums.ce / n,
        "z_loss": sums.z / n,
        "tokens": sums.tokens,
        "grad_norm": grad_norm,
        "dropped_fraction": balancing.dropped_fraction(totals.dropped, totals.counts),
        "router_spread": spread,
        **bal_metrics,
    }
    if lr is not None:
        metrics["lr"] = lr
    return biases, bal_state, metrics
