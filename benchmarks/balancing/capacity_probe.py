"""How much load imbalance and capacity overflow is left when the biases are *ideal*?

For a training checkpoint, route a few training batches through the model (dense dispatch, nothing dropped)
and record each MoE layer's router probabilities. Then, per layer and batch, compare three bias settings:

* trained: the checkpoint's biases;
* oracle:  biases re-fitted on that very batch until its global loads are even (not achievable online);
* previous-batch oracle: the oracle biases of the previous batch (the best any controller that balances
  one batch exactly can do on the next).

For each: the global load CV, and the fraction of expert tokens that overflow a capacity of
ceil(cf · T_device / E) per (device, expert) when the batch is split into `--devices` contiguous row blocks
(the expert-parallel layout, `zaya_jax.model.expert_parallel`), for several capacity factors.

    python benchmarks/balancing/capacity_probe.py --checkpoint=runs/demo/checkpoints --step=200 \
        --devices=8 --batches=4 --out=benchmarks/balancing/demo_capacity.json

It reads the router probabilities by wrapping `zaya_jax.model.router.choose` with a host callback: an
analysis hack, not library code.
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402

cpu_devices.define_flag(8)

_CKPT = flags.DEFINE_string("checkpoint", None, "Training checkpoint directory (…/checkpoints).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: newest).")
_DEVICES = flags.DEFINE_integer("devices", 8, "Row blocks = devices of the expert-parallel layout.")
_BATCHES = flags.DEFINE_integer("batches", 4, "Training batches to route.")
_ROWS = flags.DEFINE_integer("rows", 0, "Sequences per batch (0 = the global batch size of the checkpoint config).")
_FACTORS = flags.DEFINE_list("capacity_factors", ["2", "2.5", "3", "4"], "Capacity factors to evaluate.")
_OUT = flags.DEFINE_string("out", None, "JSON output path.")
flags.mark_flags_as_required(["checkpoint", "out"])


def fit_even(probs, bias, iters: int = 3000):
    """Biases that make argmax(probs + bias) split probs' rows evenly (sign steps with a decaying size)."""
    import numpy as np

    e = probs.shape[1]
    bias, step = bias.copy(), 1e-2
    for _ in range(iters):
        f = np.bincount(np.argmax(probs + bias, -1), minlength=e) / len(probs)
        bias += step * np.sign(1.0 / e - f)
        step *= 0.998
    return bias


def measure(probs, bias, devices: int, factors) -> dict:
    import numpy as np

    e = probs.shape[1]
    choice = np.argmax(probs + bias, -1).reshape(devices, -1)
    counts = np.stack([np.bincount(c, minlength=e) for c in choice])
    total = counts.sum(0)
    out = {"load_cv": float(total.std() / total.mean())}
    for cf in factors:
        cap = math.ceil(cf * choice.shape[1] / e)
        out[f"dropped_cf{cf:g}"] = float(np.maximum(counts - cap, 0).sum() / counts.sum())
    return out


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np

    from zaya_jax.checkpoint.model_io import load_model
    from zaya_jax.data.pipeline import make_iterators
    from zaya_jax.model import router

    captured = []
    choose = router.choose

    def recording_choose(probs, bias):
        jax.debug.callback(lambda p, b: captured.append((np.asarray(p), np.asarray(b))), probs, bias)
        return choose(probs, bias)

    router.choose = recording_choose
    config, model = load_model(_CKPT.value, step=_STEP.value, overrides={"dispatch": "dense"})
    experts, batch = config.model.num_experts, _ROWS.value or config.train.global_batch_size
    factors = [float(f) for f in _FACTORS.value]
    train_iter, _, _ = make_iterators(config)
    results: dict[str, dict[str, list]] = {}
    previous: dict[int, np.ndarray] = {}
    for _ in range(_BATCHES.value):
        captured.clear()
        ids = train_iter.next_batch(batch)["input_ids"]
        jax.block_until_ready(model.forward(jnp.asarray(ids)).logits)
        for layer, (p, b) in enumerate(captured):
            p, b = p.reshape(-1, experts + 1)[:, :experts], b[:experts]
            oracle = fit_even(p, b)
            settings = {"trained": b, "oracle": oracle}
            if layer in previous:
                settings["previous_batch_oracle"] = previous[layer]
            previous[layer] = oracle
            for name, bias in settings.items():
                results.setdefault(name, {}).setdefault(str(layer), []).append(
                    measure(p, bias, _DEVICES.value, factors)
                )
    summary = {
        name: {
            layer: {k: round(float(np.mean([m[k] for m in ms])), 4) for k in ms[0]} for layer, ms in per_layer.items()
        }
        for name, per_layer in results.items()
    }
    summary["setup"] = {
        "checkpoint": os.path.abspath(_CKPT.value),
        "step": _STEP.value,
        "devices": _DEVICES.value,
        "batches": _BATCHES.value,
        "rows_per_batch": batch,
        "seq_len": config.train.seq_len,
        "experts": experts,
    }
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    cli.run(main, "capacity_probe")
