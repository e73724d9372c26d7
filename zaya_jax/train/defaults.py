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
            # jax's persistent compilation cache: "" = $JAX_COMPILATION_CACHE_DIR if set, else <workdir>/xla_cache
            # (launchers without a workdir: ~/.cache/zaya_jax/xla_cache); "none" = off (launch/cli.py)
            compilation_cache_dir="",
            run_name="",  # TensorBoard run name (events in <workdir>/tensorboard/<run_name>); "" = workdir's name
            eval_every=0,
            eval_batches=4,
        )
    )
    # Expert balancing (train/balancing.py, docs/balancing.md): PI control of the router biases on the relative
    # load error; per-slot gains adapt between ki and ki_max (× gain_up while an error keeps its sign, × gain_down
    # when it flips); gains in logit units (× 1/(E+1) on the probabilities); clipped integral; mean expert bias fixed.
    config.balancing = ml_collections.ConfigDict(
        dict(
            enabled=True,
            kp=0.002,
            ki=0.002,
            ki_max=0.1,
            gain_up=1.2,
            gain_down=0.5,
            error_shape="identity",  # "identity" | "sign" | "tanh"
            tanh_tau=0.01,
            normalize_by_target=True,  # error relative to the target load: 1 − f/t
            gain_units="logit",  # "logit" (× 1/(E+1)) | "probability" (raw bias units)
            target_skip=0.0,
            skip_controlled=True,  # control the skip slot toward target_skip when that is > 0
            integral_clip=1.0,  # anti-windup: integral term |u·K_i·S| <= this (bias = probability units); 0 = no clip
            recenter=True,  # keep the mean expert bias at its initial value (no common-mode drift)
            # health warnings (train/health.py): a layer whose load CV stays above warn_cv, or whose dropped
            # fraction stays above warn_dropped, for warn_patience logged steps gets a warning (0 = off)
            warn_cv=0.5,
            warn_dropped=0.05,
            warn_patience=10,
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
        from zaya_jax.train import balancing

        balancing.validate(config.balancing)
    steps = [s for s, _ in t.batch_ramp]
    if steps != sorted(steps):
        raise ConfigError(f"train.batch_ramp start steps must increase, got {steps}")
    for _, b in t.batch_ramp:
        if b % t.microbatches:
            raise ConfigError(f"train.batch_ramp batch {b} is not divisible by train.microbatches={t.microbatches}")
    if t.seq_len > config.model.max_position_embeddings:
        raise ConfigError(f"train.seq_len={t.seq_len} exceeds model.max_position_embeddings="
                          f"{config.model.max_position_embeddings}")
