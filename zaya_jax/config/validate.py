"""`validate(config)`: every section checked in one place; each error is one `ConfigError` line naming the
field and the fix. Pure: imports nothing of the package but the defaults (choice names), the numeric
checks and the error next to it."""

from __future__ import annotations

import ml_collections

from zaya_jax.config import defaults as choices
from zaya_jax.config.errors import ConfigError
from zaya_jax.config.numeric import validate_numbers


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _choice(section: str, name: str, value: object, names: tuple[str, ...]) -> None:
    _check(value in names, f"{section}.{name}={value!r}; choose one of {names}")


def validate_model(m: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for any model field combination the model cannot build."""
    for name in (*choices.GEOMETRY_FIELDS, "cca_time0", "cca_time1"):
        _check(int(m[name]) >= 1, f"model.{name} must be a positive integer, got {m[name]!r}")
    _check(
        m.num_q_heads % m.num_kv_heads == 0,
        f"model.num_q_heads={m.num_q_heads} must be a multiple of model.num_kv_heads={m.num_kv_heads} "
        "(grouped-query attention)",
    )
    _check(
        int(m.attention_chunk) >= 0,
        f"model.attention_chunk={m.attention_chunk} must be >= 0 (0 = attend over the whole sequence at once)",
    )
    _check(m.head_dim % 2 == 0, f"model.head_dim={m.head_dim} must be even (value heads are split in halves)")
    rot = int(m.head_dim * m.partial_rotary_factor)
    _check(
        0 < m.partial_rotary_factor <= 1 and rot % 2 == 0,
        f"model.partial_rotary_factor={m.partial_rotary_factor} must give an even number of rotary dims "
        f"(head_dim*factor = {m.head_dim * m.partial_rotary_factor})",
    )
    _check(
        (m.num_kv_heads * m.head_dim) % 2 == 0,
        "model.num_kv_heads*head_dim must be even: the value projection is split into current/delayed halves",
    )
    _check(
        m.num_experts_per_tok == 1,
        f"model.num_experts_per_tok={m.num_experts_per_tok}: the ZAYA1 router supports top-1 only; set it to 1",
    )
    _choice("model", "skip_output", m.skip_output, choices.SKIP_OUTPUTS)
    _check(
        m.dispatch not in choices.RENAMED_DISPATCHES,
        f"model.dispatch={m.dispatch!r} is now model.dispatch=dropless with model.kernels.grouped_gemm="
        f"{choices.RENAMED_DISPATCHES.get(m.dispatch)}",
    )
    _choice("model", "dispatch", m.dispatch, choices.DISPATCHES)
    validate_kernels(m)
    _check(m.capacity_factor > 0, f"model.capacity_factor={m.capacity_factor} must be > 0")
    _check(
        m.dtype in choices.DTYPES and m.param_dtype in choices.DTYPES,
        f"model.dtype={m.dtype!r} / model.param_dtype={m.param_dtype!r}; choose from {choices.DTYPES}",
    )
    _choice("model", "remat", m.remat, choices.REMAT_POLICIES)
    _check(bool(m.tie_word_embeddings), "model.tie_word_embeddings must be True: ZAYA1 ties the LM head")
    _check(
        m.rope_theta > 0 and m.rms_norm_eps > 0 and m.qk_norm_eps > 0,
        "model.rope_theta, model.rms_norm_eps and model.qk_norm_eps must be > 0",
    )


def validate_kernels(m: ml_collections.ConfigDict) -> None:
    """`model.kernels`: known names, and the combinations a kernel cannot run (docs/kernels.md)."""
    k = m.kernels
    for name, names in (
        ("platform", choices.KERNEL_PLATFORMS),
        ("matmul", choices.MATMUL_KERNELS),
        ("grouped_gemm", choices.GROUPED_GEMM_KERNELS),
        ("attention", choices.ATTENTION_KERNELS),
    ):
        _choice("model.kernels", name, k[name], names)
    _check(
        k.attention != "cudnn" or (m.dtype == "bfloat16" and k.platform in ("auto", "cuda")),
        f"model.kernels.attention=cudnn needs model.dtype=bfloat16 on CUDA (now dtype={m.dtype!r}, "
        f"platform={k.platform!r}); use model.kernels.attention=auto or xla",
    )
    _check(
        k.attention != "pallas" or m.dtype == "bfloat16",
        f"model.kernels.attention=pallas needs model.dtype=bfloat16 (now {m.dtype!r}); "
        "use model.kernels.attention=auto or xla",
    )


def check_sequence_split(config: ml_collections.ConfigDict, context: int) -> None:
    """Raise ConfigError unless `train.seq_len` splits into equal context-parallel chunks of at least the CCA
    convolution halo (`context` devices; 2·context chunks with the zigzag layout)."""
    if context <= 1:
        return
    m, seq = config.model, int(config.train.seq_len)
    chunks_per_device = choices.CONTEXT_CHUNKS[config.mesh.context_layout]
    chunks = context * chunks_per_device
    halo = (m.cca_time0 - 1) + (m.cca_time1 - 1)
    if seq % chunks:
        raise ConfigError(
            f"train.seq_len={seq} is not divisible by mesh.context={context}"
            + (f" x {chunks_per_device} ({config.mesh.context_layout} layout)" if chunks_per_device > 1 else "")
            + f": context parallelism splits every sequence into {chunks} equal chunks; choose a "
            f"multiple of {chunks} or another mesh.context"
        )
    if seq // chunks < max(halo, 1):
        raise ConfigError(
            f"train.seq_len={seq} / {chunks} chunks gives {seq // chunks} tokens per chunk, fewer than "
            f"the CCA conv halo ({halo}); use a longer sequence or a smaller mesh.context"
        )


def validate_mesh(config: ml_collections.ConfigDict) -> None:
    """Mesh sizes, the expert split and the context-parallel sequence split (needs model, mesh and train)."""
    sizes = [config.mesh.data, config.mesh.expert, config.mesh.context]
    _check(all(s == -1 or s >= 1 for s in sizes), f"mesh sizes must be >= 1 or -1, got {sizes}")
    _check(sizes.count(-1) <= 1, f"at most one mesh axis may be -1 (fill), got data/expert/context={sizes}")
    if config.mesh.expert > 1:
        _check(
            config.model.num_experts % config.mesh.expert == 0,
            f"model.num_experts={config.model.num_experts} is not divisible by mesh.expert={config.mesh.expert}",
        )
    _choice("mesh", "context_layout", config.mesh.context_layout, choices.CONTEXT_LAYOUTS)
    check_sequence_split(config, int(config.mesh.context))


def validate_optimizer(o: ml_collections.ConfigDict, steps: int) -> None:
    """The optimizer section and its LR schedule over `steps` (= train.steps) optimizer steps."""
    _choice("optimizer", "schedule", o.schedule, choices.SCHEDULES)
    _choice("optimizer", "wsd_decay_shape", o.wsd_decay_shape, choices.DECAY_SHAPES)
    warmup = int(o.warmup_steps)  # a run shorter than its warm-up warms up over all its steps (train/schedule.py)
    _check(0 <= warmup, f"optimizer.warmup_steps={warmup} must be >= 0")
    if o.schedule == "wsd":
        _check(0.0 < o.decay_fraction <= 1.0, f"optimizer.decay_fraction={o.decay_fraction} must be in (0, 1]")


def validate_train(config: ml_collections.ConfigDict) -> None:
    t = config.train
    for name, low in (
        ("steps", 1),
        ("seq_len", 1),
        ("global_batch_size", 1),
        ("microbatches", 1),
        ("log_every", 1),
        ("eval_every", 0),
        ("eval_batches", 1),
        ("loss_chunk", 1),
    ):
        _check(isinstance(t[name], int) and t[name] >= low, f"train.{name}={t[name]!r} must be an integer >= {low}")
    _choice("train", "param_sharding", t.param_sharding, choices.PARAM_SHARDINGS)
    _choice("train", "grad_reduce_dtype", t.grad_reduce_dtype, choices.GRAD_REDUCE_DTYPES)
    for name in ("overlap_collectives", "pipeline_update"):
        _check(isinstance(t[name], bool), f"train.{name}={t[name]!r} must be True or False")
    _check(
        not t.overlap_collectives or (t.param_sharding == "zero1" and config.model.remat == "full"),
        "train.overlap_collectives=True reduce-scatters inside the ZeRO-1 step's fused backward pass, which runs with "
        f"model.remat='full' and train.param_sharding='zero1' (here {config.model.remat!r}, {t.param_sharding!r}): "
        "set both, or leave overlap_collectives False",
    )
    _check(
        t.global_batch_size % t.microbatches == 0,
        f"train.global_batch_size={t.global_batch_size} must be divisible by train.microbatches={t.microbatches}",
    )
    starts = [int(s) for s, _ in t.batch_ramp]
    _check(
        starts == sorted(starts) and len(set(starts)) == len(starts) and all(s >= 0 for s in starts),
        f"train.batch_ramp start steps must be distinct, >= 0 and increasing, got {starts}",
    )
    for _, b in t.batch_ramp:
        _check(
            int(b) >= 1 and int(b) % t.microbatches == 0,
            f"train.batch_ramp batch {b} must be >= 1 and divisible by train.microbatches={t.microbatches}",
        )
    _check(
        t.seq_len <= config.model.max_position_embeddings,
        f"train.seq_len={t.seq_len} exceeds model.max_position_embeddings={config.model.max_position_embeddings}",
    )
    _check(float(t.peak_tflops) >= 0, f"train.peak_tflops={t.peak_tflops} must be >= 0 (0 = the hardware table)")


def validate_balancing(cfg: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` naming the `balancing.*` field that is out of range (`cfg` = config.balancing)."""
    _choice("balancing", "error_shape", cfg.error_shape, choices.ERROR_SHAPES)
    _choice("balancing", "gain_units", cfg.gain_units, choices.GAIN_UNITS)
    _check(
        not (cfg.error_shape == "tanh" and cfg.tanh_tau <= 0),
        f"balancing.tanh_tau={cfg.tanh_tau} must be > 0 with error_shape='tanh'",
    )
    _check(0.0 <= cfg.target_skip < 1.0, f"balancing.target_skip={cfg.target_skip} must be in [0, 1)")
    _check(cfg.integral_clip >= 0, f"balancing.integral_clip={cfg.integral_clip} must be >= 0 (0 = no clip)")
    _check(cfg.kp >= 0 and cfg.ki >= 0, f"balancing.kp={cfg.kp} and balancing.ki={cfg.ki} must be >= 0")
    _check(
        cfg.ki_max >= cfg.ki,
        f"balancing.ki_max={cfg.ki_max} must be >= balancing.ki={cfg.ki} (set them equal for a fixed gain)",
    )
    _check(cfg.ki_min > 0, f"balancing.ki_min={cfg.ki_min} must be > 0 (the gain's floor; = ki: no slow-down)")
    _check(
        cfg.gain_up >= 1 and 0 < cfg.gain_down <= 1,
        f"balancing.gain_up={cfg.gain_up} must be >= 1 and balancing.gain_down={cfg.gain_down} in (0, 1]",
    )
    _check(cfg.warn_patience >= 0, f"balancing.warn_patience={cfg.warn_patience} must be >= 0 (0 = no warnings)")


def validate_data(d: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for invalid `config.data` values."""
    sources, weights = tuple(d.sources), tuple(d.weights)
    _check(
        all(isinstance(s, str) and s for s in sources),
        f"data.sources={sources!r} must be a tuple of prepared directory paths",
    )
    n = max(len(sources), 1)
    _check(
        not weights or len(weights) == n,
        f"data.weights has {len(weights)} entries but there are {n} sources; "
        "give one weight per source or leave it empty for uniform",
    )
    _check(
        not weights or (min(weights) >= 0 and sum(weights) > 0),
        f"data.weights={weights!r} must be non-negative with a positive sum",
    )
    _check(
        isinstance(d.tokenizer, str) and bool(d.tokenizer),
        f"data.tokenizer={d.tokenizer!r}; use 'byte' or a path to a tokenizer.json",
    )
    _check(
        int(d.default_corpus_max_bytes) > 0, f"data.default_corpus_max_bytes={d.default_corpus_max_bytes} must be > 0"
    )
    _check(0.0 <= float(d.eval_fraction) < 1.0, f"data.eval_fraction={d.eval_fraction} must be in [0, 1)")
    _check(int(d.shuffle_seed) >= 0, f"data.shuffle_seed={d.shuffle_seed} must be >= 0")


def validate_checkpoint(c: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` for invalid `config.checkpoint` values."""
    for name in ("every", "keep_every", "spike_window", "max_rollbacks"):
        _check(int(c[name]) >= 0, f"checkpoint.{name}={c[name]} must be >= 0")
    _check(int(c.keep) >= 1, f"checkpoint.keep={c.keep} must be >= 1 (the newest checkpoint is always kept)")
    _check(float(c.spike_zscore) >= 0, f"checkpoint.spike_zscore={c.spike_zscore} must be >= 0 (0 = off)")
    _check(
        not (float(c.spike_zscore) > 0 and int(c.spike_window) < 4),
        f"checkpoint.spike_window={c.spike_window} must be >= 4 when spike_zscore > 0",
    )


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Check every section of a full config tree (`default_config()` with overrides) and return it unchanged."""
    missing = [name for name in choices.SECTIONS if name not in config]
    _check(not missing, f"config has no section(s) {missing}; start the config from zaya_jax.config.default_config()")
    validate_numbers(config)
    validate_model(config.model)
    validate_train(config)
    validate_mesh(config)
    validate_optimizer(config.optimizer, int(config.train.steps))
    validate_balancing(config.balancing)
    validate_data(config.data)
    validate_checkpoint(config.checkpoint)
    return config
