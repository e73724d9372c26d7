"""Default config sections for training: optimizer, schedule, train loop, balancing, data, checkpoints.

Kept next to the training code (EasyLM / big_vision style); `zaya_jax.config.default_config`
assembles them with the model and mesh sections.
"""

from __future__ import annotations

import ml_collections

SCHEDULES = ("warmup_cosine", "wsd", "constant")
PARAM_SHARDINGS = ("zero1", "fsdp", "replicated")


def add_to(config: ml_collections.ConfigDict) -> None:
    config.optimizer = ml_collections.ConfigDict(
        dict(
            learning_rate=3e-3,  # Muon peak LR (matrices)
            adam_learning_rate=3e-3,  # AdamW peak LR (embeddings, norms, biases, scales, convs, temps)
            adam_b1=0.9,
            adam_b2=0.95,
            adam_eps=1e-8,
            weight_decay=0.1,
            muon_momentum=0.95,
            muon_ns_steps=5,
            muon_nesterov=True,
            muon_split_gate_up=True,  # orthogonalise the fused expert gate/up kernel as two matrices
            muon_conv=False,  # Muon for the per-head conv2 taps (unknown in the paper; AdamW by default)
            # Muon update scale: >0 → sqrt(max(fan_in, fan_out)) * value (update RMS ≈ value, so the Muon LR
            # is comparable to AdamW's; Moonshot's 0.2); 0 → Keller Jordan's sqrt(max(1, fan_out / fan_in))
            muon_consistent_rms=0.2,
            decay_embedding=False,  # weight decay on the (tied) embedding; matrices and conv kernels always decay
            grad_clip_norm=1.0,
            schedule="warmup_cosine",  # "warmup_cosine" | "wsd" | "constant"
            warmup_steps=100,
            decay_fraction=0.2,  # WSD: final fraction of steps spent decaying
            wsd_decay_shape="linear",  # WSD decay: "linear" | "sqrt" (1 - sqrt)
            min_lr_ratio=0.1,
        )
    )
    config.train = ml_collections.ConfigDict(
        dict(
            steps=1000,
            seq_len=4096,
            global_batch_size=8,  # sequences per optimizer step
            microbatches=1,  # gradient accumulation
            # batch-size ramp: tuple of (start_step, global_batch_size); empty = constant batch
            batch_ramp=(),
            z_loss=0.0,
            seed=0,
            param_sharding="zero1",  # "zero1" | "fsdp" | "replicated"
            # dtype of the gradient reduce-scatter (ZeRO-1): "float32" (exact sums) or "bfloat16" (half the bytes)
            grad_reduce_dtype="float32",
            loss_chunk=1024,  # sequence positions per cross-entropy chunk (tied head + log-softmax)
            log_every=10,
            eval_every=0,
            eval_batches=4,
        )
    )
    config.balancing = ml_collections.ConfigDict(
        dict(
            enabled=True,
            kp=0.0,
            ki=1e-3,
            kd=0.0,
            error_shape="sign",  # "identity" | "sign" | "tanh"
            tanh_tau=0.01,
            normalize_by_target=False,
            target_skip=0.0,
            skip_controlled=False,
            integral_clip=0.0,  # 0 = no clipping
            recenter=False,
        )
    )


def validate(config: ml_collections.ConfigDict) -> None:
    from zaya_jax.config import ConfigError

    t, o = config.train, config.optimizer
    for name, low in (("steps", 1), ("seq_len", 1), ("global_batch_size", 1), ("microbatches", 1), ("log_every", 1),
                      ("eval_every", 0), ("eval_batches", 1)):
        if not isinstance(t[name], int) or t[name] < low:
            raise ConfigError(f"train.{name}={t[name]!r} must be an integer >= {low}")
    if o.schedule not in SCHEDULES:
        raise ConfigError(f"optimizer.schedule={o.schedule!r}; choose one of {SCHEDULES}")
    if t.param_sharding not in PARAM_SHARDINGS:
        raise ConfigError(f"train.param_sharding={t.param_sharding!r}; choose one of {PARAM_SHARDINGS}")
    if t.grad_reduce_dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"train.grad_reduce_dtype={t.grad_reduce_dtype!r}; choose 'float32' or 'bfloat16'")
    if t.loss_chunk < 1:
        raise ConfigError(f"train.loss_chunk={t.loss_chunk} must be >= 1 (sequence positions per loss chunk)")
    if t.microbatches < 1 or t.global_batch_size % t.microbatches:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size} must be divisible by train.microbatches={t.microbatches}")
    if o.get("wsd_decay_shape", "linear") not in ("linear", "sqrt"):
        raise ConfigError(f"optimizer.wsd_decay_shape={o.wsd_decay_shape!r}; choose 'linear' or 'sqrt'")
    if "balancing" in config:
        b = config.balancing
        if b.error_shape not in ("identity", "sign", "tanh"):
            raise ConfigError(f"balancing.error_shape={b.error_shape!r}; choose identity, sign or tanh")
        if not 0.0 <= b.target_skip < 1.0:
            raise ConfigError(f"balancing.target_skip={b.target_skip} must be in [0, 1)")
    steps = [s for s, _ in t.batch_ramp]
    if steps != sorted(steps):
        raise ConfigError(f"train.batch_ramp start steps must increase, got {steps}")
    for _, b in t.batch_ramp:
        if b % t.microbatches:
            raise ConfigError(f"train.batch_ramp batch {b} is not divisible by train.microbatches={t.microbatches}")
    if t.seq_len > config.model.max_position_embeddings:
        raise ConfigError(f"train.seq_len={t.seq_len} exceeds model.max_position_embeddings="
                          f"{config.model.max_position_embeddings}")
