"""Learning-rate schedules and the global batch-size ramp (arXiv 2511.17127).

LR schedules are `optax.Schedule`s (step → LR) indexed by optimizer step, built from
`config.optimizer` and `config.train.steps`:

* ``warmup_cosine``: linear warmup 0 → peak over `warmup_steps`, then cosine decay to
  `min_lr_ratio · peak` at `train.steps` (`optax.warmup_cosine_decay_schedule`).
* ``wsd`` (warmup-stable-decay): linear warmup, constant peak, and over the final
  `decay_fraction · steps` steps a decay to `min_lr_ratio · peak`, either linear
  (`wsd_decay_shape="linear"`) or `1 − sqrt` (`"sqrt"`: lr = min + (peak − min)(1 − sqrt(u)),
  u ∈ [0, 1] the fraction of the decay phase done).
* ``constant``: linear warmup, then peak forever.

The warmup starts at LR 0 (step 0 makes no update), as `optax.linear_schedule(0, peak, warmup)`. A run
shorter than its warm-up (a smoke run with `train.steps=2`) warms up over all its steps instead
(`warmup_steps`; `warmup_note` says so once, the training loop prints it).

Batch ramp: `train.batch_ramp` is a tuple of `(start_step, global_batch_size)` stages with
increasing start steps; before the first stage the batch is `train.global_batch_size`. The paper
ramps the batch during pretraining (values unknown, arXiv 2511.17127); every stage's batch
must be divisible by data-parallel size × microbatches (`validate_batch_ramp`).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax

from zaya_jax.config import DECAY_SHAPES, SCHEDULES, ConfigError, check_sequence_split, choice_table


def _wsd(peak: float, steps: int, warmup: int, decay_fraction: float, min_ratio: float, shape: str) -> optax.Schedule:
    """Warmup-stable-decay: 0 →(linear, `warmup`) peak → hold → decay over the last
    `round(decay_fraction · steps)` steps to `min_ratio · peak` (value reached at `steps`)."""
    shape_fn = _DECAY_SHAPES[shape]
    decay_start = max(warmup, steps - max(1, int(round(decay_fraction * steps))))
    decay = max(1, steps - decay_start)
    end = min_ratio * peak

    def decay_fn(count):
        u = jnp.clip(count / decay, 0.0, 1.0)
        frac = shape_fn(u)
        return end + (peak - end) * (1.0 - frac)

    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak), decay_fn],
        boundaries=[warmup, decay_start],
    )


_DECAY_SHAPES = choice_table(DECAY_SHAPES, {"linear": lambda u: u, "sqrt": jnp.sqrt})  # fraction of the decay done


def warmup_steps(opt: ml_collections.ConfigDict, steps: int) -> int:
    """`optimizer.warmup_steps`, clamped to the run's `steps`."""
    return min(int(opt.warmup_steps), max(int(steps), 0))


def warmup_note(config: ml_collections.ConfigDict) -> str | None:
    """A one-line note when the warm-up was clamped to a run shorter than it, else None."""
    warmup, steps = int(config.optimizer.warmup_steps), int(config.train.steps)
    if warmup <= steps:
        return None
    return f"optimizer.warmup_steps={warmup} > train.steps={steps}: warming up over all {steps} steps instead"


def _warmup_cosine(opt: ml_collections.ConfigDict, steps: int, peak: float) -> optax.Schedule:
    warmup = warmup_steps(opt, steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=opt.min_lr_ratio * peak,
    )


def _constant(opt: ml_collections.ConfigDict, steps: int, peak: float) -> optax.Schedule:
    warmup = warmup_steps(opt, steps)
    if warmup == 0:
        return optax.constant_schedule(peak)
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup])


_SCHEDULES = choice_table(
    SCHEDULES,
    {
        "warmup_cosine": _warmup_cosine,
        "wsd": lambda opt, steps, peak: _wsd(
            peak, steps, warmup_steps(opt, steps), opt.decay_fraction, opt.min_lr_ratio, opt.wsd_decay_shape
        ),
        "constant": _constant,
    },
)


def make_schedule(opt: ml_collections.ConfigDict, steps: int, peak: float) -> optax.Schedule:
    """One schedule with peak `peak` following `opt.schedule` over `steps` optimizer steps (`opt` validated by
    `zaya_jax.config.validate_optimizer`)."""
    return _SCHEDULES[opt.schedule](opt, steps, peak)


def learning_rate_schedules(config: ml_collections.ConfigDict) -> dict[str, optax.Schedule]:
    """{"muon": schedule peaking at `optimizer.learning_rate`, "adam": … at `optimizer.adam_learning_rate`}.

    Both share the shape; the trainer logs `schedules[k](step)`.
    """
    o, steps = config.optimizer, int(config.train.steps)
    return {"muon": make_schedule(o, steps, o.learning_rate), "adam": make_schedule(o, steps, o.adam_learning_rate)}


# ----------------------------------------------------------------------------- batch ramp


def _stages(train_cfg: ml_collections.ConfigDict) -> list[tuple[int, int]]:
    """(start, batch) stages of a validated `train.batch_ramp` (`zaya_jax.config.validate_train`)."""
    return [(int(s), int(b)) for s, b in train_cfg.batch_ramp]


def batch_size_at(step: int, train_cfg: ml_collections.ConfigDict) -> int:
    """Global batch (sequences per optimizer step) at `step`: the last stage with start ≤ step,
    or `train.global_batch_size` before the first stage / with an empty ramp."""
    batch = int(train_cfg.global_batch_size)
    for start, b in _stages(train_cfg):
        if start <= step:
            batch = b
        else:
            break
    return batch


def ramp_boundaries(train_cfg: ml_collections.ConfigDict) -> tuple[int, ...]:
    """Steps s > 0 (and < train.steps) at which the global batch differs from step s − 1.

    The trainer rebuilds / recompiles its step function (new batch shape) at these steps.
    """
    steps = int(train_cfg.steps)
    out = []
    for start, _ in _stages(train_cfg):
        if 0 < start < steps and batch_size_at(start, train_cfg) != batch_size_at(start - 1, train_cfg):
            out.append(start)
    return tuple(out)


def ramp_segments(train_cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """[(start, end, batch)] covering [0, train.steps): constant batch on each half-open range."""
    edges = [0, *ramp_boundaries(train_cfg), int(train_cfg.steps)]
    return [(a, b, batch_size_at(a, train_cfg)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def samples_before(step: int, train_cfg: ml_collections.ConfigDict) -> int:
    """Sequences consumed by steps [0, step): the global data position at the start of `step`."""
    total = 0
    for a, b, batch in ramp_segments(train_cfg):
        if step <= a:
            break
        total += (min(step, b) - a) * batch
    if step > int(train_cfg.steps):  # beyond the configured run: last batch continues
        total += (step - int(train_cfg.steps)) * batch_size_at(int(train_cfg.steps), train_cfg)
    return total


def validate_batch_ramp(train_cfg: ml_collections.ConfigDict, dp_size: int) -> None:
    """Raise `ConfigError` unless the step-0 batch and every ramp stage divide by dp_size × train.microbatches.

    dp_size: number of data-parallel shards of the batch (product of the data-like mesh axes).
    """
    if dp_size < 1:
        raise ConfigError(f"data-parallel size must be >= 1, got {dp_size}")
    mb = int(train_cfg.microbatches)
    need = dp_size * mb
    checks = [
        (
            "train.global_batch_size"
            if not train_cfg.batch_ramp or train_cfg.batch_ramp[0][0] > 0
            else "train.batch_ramp stage at step 0",
            batch_size_at(0, train_cfg),
        )
    ]
    checks += [(f"train.batch_ramp stage at step {start}", b) for start, b in _stages(train_cfg)]
    for where, batch in checks:
        if batch % need:
            raise ConfigError(
                f"{where}: batch {batch} is not divisible by data-parallel size {dp_size} × "
                f"train.microbatches {mb} = {need}; use a multiple of {need}"
            )


def check_layout(config: ml_collections.ConfigDict, sizes: dict[str, int], *, process_count: int = 1) -> None:
    """Raise a one-line ConfigError unless `config` can train on a mesh of `sizes` ({'data', 'expert', 'context'}).

    Checks, for the step-0 batch and every stage of `train.batch_ramp`: the global batch divides by
    data × expert × train.microbatches (each device gets whole sequences of every micro-batch) and by the
    process count (each process loads an equal share); and the sequence splits over `context`
    (`check_sequence_split`). Pure: no devices are touched.
    """
    t, data, expert = config.train, int(sizes.get("data", 1)), int(sizes.get("expert", 1))
    try:
        validate_batch_ramp(t, data * expert)
    except ConfigError as err:
        raise ConfigError(f"mesh data={data} x expert={expert}: {err}, or another mesh") from None
    for batch in {batch_size_at(0, t), *(int(b) for _, b in t.batch_ramp)}:
        if batch % process_count:
            raise ConfigError(
                f"global batch {batch} is not divisible by the {process_count} processes (each loads "
                "an equal share); use a multiple of the process count"
            )
    check_sequence_split(config, int(sizes.get("context", 1)))
