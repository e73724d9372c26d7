"""ZAYA1 experiments as variants of one table (the big_vision `config:arg` convention).

    --config=experiments/zaya1.py:tiny        ~1M parameters: tests, debugging (CPU)
    --config=experiments/zaya1.py:demo        ~3M parameters: the README demo on 8 emulated CPU devices
    --config=experiments/zaya1.py:100m        ~114M parameters: CPU benchmarks (the transformers comparison)
    --config=experiments/zaya1.py:h1024       hidden 1024, 4 layers: the CPU MFU benchmark
    --config=experiments/zaya1.py:1b          ZAYA1-base's layer x 5 (1.1B total, 161M active), bf16, seq 4096: one GPU
    --config=experiments/zaya1.py:base        ZAYA1-base (8.84B, 1.29B active; paper: 8.3B / 760M sans embedding)
    --config=experiments/zaya1.py:phase1      the paper's three training phases of ZAYA1-base (below)
    --config=experiments/zaya1.py:phase2
    --config=experiments/zaya1.py:phase3
    --config=experiments/zaya1.py:tiny,train.steps=5,model.dispatch=ep    extra `field=value` overrides

`zaya1_<variant>.py` are one-line files naming a variant (`--config=experiments/zaya1_base.py:phase2` is
`zaya1.py:phase2`). Values of the extras are Python literals (strings may go unquoted).

Training phases (arXiv 2511.17127) on the 1024 × MI300X cluster. Known from the paper / Zyphra [P][Z]: three
phases in this order, the curriculum moving towards dense STEM and reasoning data; 4k context in phases 1–2,
extended to 32k with context-parallel CCA; 12–14T tokens in total; Muon + AdamW; a progressive batch-size ramp;
data parallel + ZeRO-1, no EP / TP. **Every number of the phases is inferred [I]** (token split, LRs,
schedules, ramp values, mixtures, the phase-1/2 RoPE θ): the paper does not publish them. Tags: [P] the
paper, [Z] Zyphra's public statements, [I] inferred. Data: `data.sources` are directories prepared with
`launch/prepare_data.py`, one per source, under `$ZAYA_DATA_ROOT` (default /data/zaya1); the source split
itself is a placeholder for an unknown mixture. Each phase starts from the previous one's weights at
optimizer step 0 (own warmup, schedule and data order); `launch/rocm/README.md` shows the hand-over with
`launch.reshard`.
"""

from __future__ import annotations

import ast
import os
from typing import NamedTuple

import ml_collections

from zaya_jax.config import ConfigError, default_config


# ---------------------------------------------------------------------------- the variants
class Geometry(NamedTuple):
    """The sizes of a variant, each named: `zaya_jax.config.GEOMETRY_FIELDS` and the positions (all required)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    moe_intermediate_size: int  # expert width
    router_hidden_size: int
    max_position_embeddings: int


GEOMETRY = {
    "tiny": Geometry(
        vocab_size=384,  # the byte tokenizer's 259 ids padded to 128s
        hidden_size=64,
        num_layers=2,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        num_experts=4,
        moe_intermediate_size=64,
        router_hidden_size=16,
        max_position_embeddings=1024,
    ),
    "demo": Geometry(
        vocab_size=384,
        hidden_size=128,
        num_layers=4,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=32,
        num_experts=8,
        moe_intermediate_size=128,
        router_hidden_size=32,
        max_position_embeddings=1024,
    ),
    "100m": Geometry(
        vocab_size=8192,
        hidden_size=512,
        num_layers=8,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=128,
        num_experts=16,
        moe_intermediate_size=512,
        router_hidden_size=128,
        max_position_embeddings=4096,
    ),
    "h1024": Geometry(
        vocab_size=8192,
        hidden_size=1024,
        num_layers=4,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=128,
        num_experts=8,
        moe_intermediate_size=1024,
        router_hidden_size=256,
        max_position_embeddings=4096,
    ),
    "1b": Geometry(  # ZAYA1-base's layer; 1.1B total (launch.gpu_check)
        vocab_size=32_768,
        hidden_size=2048,
        num_layers=5,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=128,
        num_experts=16,
        moe_intermediate_size=2048,
        router_hidden_size=256,
        max_position_embeddings=4096,
    ),
    "base": Geometry(  # = model_config(), docs/architecture.md §1
        vocab_size=262_272,
        hidden_size=2048,
        num_layers=40,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=128,
        num_experts=16,
        moe_intermediate_size=2048,
        router_hidden_size=256,
        max_position_embeddings=32_768,
    ),
}
# everything else a variant sets, by section
SETTINGS: dict[str, dict[str, dict]] = {
    "tiny": {
        "model": dict(rope_theta=10_000.0),
        "train": dict(seq_len=128, global_batch_size=8, steps=100),
        "optimizer": dict(warmup_steps=10),
    },
    # 2 data × 4 expert; 4 sequences (1024 tokens) per device. The load CV of one step's batch cannot go much
    # below what its sequences' content allows: 16 sequences per step left the last MoE layer at ≈ 0.3, 32
    # leave every layer ≈ 0.2 (benchmarks/balancing/README.md). Per-device content variation overflows a 2x
    # capacity even with balanced global loads; 3x keeps drops well under 1%. Step 0 is saved as the
    # baseline for `launch.eval`.
    "demo": {
        "model": dict(rope_theta=10_000.0, dispatch="ep", capacity_factor=3.0),
        "mesh": dict(data=2, expert=4),
        # held-out loss every 20 steps: a 10-point curve in TensorBoard (10 x 4 forward-only batches, about the
        # cost of 13 training steps)
        "train": dict(seq_len=256, global_batch_size=32, steps=200, log_every=10, eval_every=20, eval_batches=4),
        "optimizer": dict(learning_rate=0.02, adam_learning_rate=3e-3, warmup_steps=20, weight_decay=0.01),
        "checkpoint": dict(save_initial=True),
    },
    "100m": {"train": dict(seq_len=256, global_batch_size=8)},
    "h1024": {"train": dict(seq_len=512, global_batch_size=4)},
    # one GPU's worth: 4 x 4096 tokens per step in bf16 without remat (launch.gpu_check's MFU config)
    "1b": {"model": dict(dtype="bfloat16"), "train": dict(seq_len=4096, global_batch_size=4), "mesh": dict(data=-1)},
    # the paper-faithful systems preset: bf16, full remat, data parallel over every device
    "base": {"model": dict(dtype="bfloat16", remat="full"), "train": dict(seq_len=4096), "mesh": dict(data=-1)},
}


def variant(name: str) -> ml_collections.ConfigDict:
    """`default_config()` with the geometry and settings of size variant `name` (a key of GEOMETRY)."""
    config = default_config()
    config.model.update(GEOMETRY[name]._asdict())
    for section, values in SETTINGS[name].items():
        config[section].update(values)
    return config


# ---------------------------------------------------------------------------- the training phases of ZAYA1-base
DP_GPUS = 1024  # 128 nodes × 8 MI300X [Z]; every batch below divides by it (× microbatches)
PEAK_LR = 4e-4  # [I] typical AdamW-scale peak for a ~1B-active MoE at multi-million-token batches; Muon uses
# muon_consistent_rms = 0.2 so one peak serves both. Not from the paper: tune on small runs.

# Phase-1/2 θ [I]: the paper does not say whether θ changed at the 32k extension. 1e4 is the legacy ZAYA
# class default (the only public value below 1e6 tied to ZAYA code); raising θ 100× when extending the
# context is the usual "adjusted base frequency" recipe (e.g. Qwen2.5's 1e4 → 1e6).
SHORT_ROPE_THETA = 1e4
LONG_ROPE_THETA = 1e6  # the released ZAYA1-base value (docs/architecture.md §1)


def data_root() -> str:
    return os.environ.get("ZAYA_DATA_ROOT", "/data/zaya1")


def set_mixture(config: ml_collections.ConfigDict, mixture: dict[str, float]) -> None:
    """data.sources / data.weights from {source name: weight}; weights must sum to 1."""
    total = sum(mixture.values())
    if abs(total - 1.0) > 1e-9:
        raise ConfigError(f"mixture weights sum to {total}, expected 1: {mixture}")
    config.data.sources = tuple(os.path.join(data_root(), name) for name in mixture)
    config.data.weights = tuple(float(w) for w in mixture.values())


def steps_for_tokens(tokens: float, seq_len: int, batch: int, ramp: tuple[tuple[int, int], ...] = ()) -> int:
    """Optimizer steps until `tokens` tokens are consumed: `batch` sequences per step before the first
    ramp stage, then each stage's batch from its start step (the `train.batch_ramp` convention)."""
    done, step = 0.0, 0
    for start, next_batch in ramp:
        stage_tokens = (start - step) * batch * seq_len
        if done + stage_tokens >= tokens:
            break
        done, step, batch = done + stage_tokens, start, next_batch
    return step + int(-(-(tokens - done) // (batch * seq_len)))  # ceil


def _common(config: ml_collections.ConfigDict) -> None:
    o, c, t = config.optimizer, config.checkpoint, config.train
    o.learning_rate = o.adam_learning_rate = PEAK_LR
    o.weight_decay = 0.1  # [I] (optimizer defaults; betas, Muon momentum, NS steps also unknown)
    t.microbatches = 1  # [I] 1–4 sequences of 4k (or 4 × 4k CP chunks) per GPU fit 192 GB with full remat
    t.log_every = 10
    t.eval_every = 1000
    c.every = 500  # [I] frequent saves: the paper reports >10× faster saves and automated restarts (Aegis)
    c.keep = 3
    c.keep_every = 10_000
    c.spike_zscore = 6.0  # [I] roll back on loss spikes as well as NaN/Inf


def phase1(config: ml_collections.ConfigDict) -> None:
    """Web-heavy pretraining at 4k [Z]; ≈10T tokens [I] of the 12–14T; batch ramp 4M → 8M → 16M tokens [I]."""
    t, o = config.train, config.optimizer
    t.seq_len = 4096  # [Z][P]
    config.model.max_position_embeddings = 4096  # [I] positions up to 4,096 in the 4k phases 1–2
    config.model.rope_theta = SHORT_ROPE_THETA  # [I]
    t.global_batch_size = 1024  # 1 sequence per GPU, 4.2M tokens [I]
    t.batch_ramp = ((10_000, 2048), (30_000, 4096))  # 8.4M then 16.8M tokens per step [I]; ramp is [S]
    t.steps = steps_for_tokens(10e12, t.seq_len, t.global_batch_size, t.batch_ramp)
    o.schedule = "wsd"  # [I] stable LR so the hand-over to phase 2 can re-warm (zcookbook annealing advice)
    o.warmup_steps = 2000
    o.decay_fraction = 0.1
    o.wsd_decay_shape = "sqrt"
    o.min_lr_ratio = 0.1
    set_mixture(
        config,
        {  # [I] web-dominated; the paper names no sources
            "web": 0.75,  # filtered Common-Crawl-style web text
            "code": 0.10,
            "stem": 0.07,  # papers, textbooks, encyclopedic text
            "math": 0.05,
            "structured": 0.03,  # tables, JSON/CSV, markup
        },
    )


def phase2(config: ml_collections.ConfigDict) -> None:
    """Math / code / structured-data-heavy phase at 4k [Z]; ≈2T tokens [I]."""
    t, o = config.train, config.optimizer
    t.seq_len = 4096
    config.model.max_position_embeddings = 4096
    config.model.rope_theta = SHORT_ROPE_THETA  # [I] unchanged from phase 1
    t.global_batch_size = 4096  # 16.8M tokens, the end of phase 1's ramp [I]
    t.steps = steps_for_tokens(2e12, t.seq_len, t.global_batch_size)
    # [I] Zyphra/zcookbook annealing advice: re-warm to ≈75% of the peak, decay to 0
    o.schedule = "warmup_cosine"
    o.learning_rate = o.adam_learning_rate = 0.75 * PEAK_LR
    o.warmup_steps = 1000
    o.min_lr_ratio = 0.0
    set_mixture(
        config,
        {  # [I] shift towards dense STEM; web replay kept at 35%
            "web": 0.35,
            "code": 0.20,
            "math": 0.20,
            "stem": 0.15,
            "structured": 0.10,
        },
    )


def phase3(config: ml_collections.ConfigDict) -> None:
    """Long-context + reasoning mid-training: 4k → 32k with context-parallel CCA [Z][P]; ≈2T tokens [I]
    (the 14T − 12T reading of arXiv 2511.17127); RoPE θ raised for the longer context [I]."""
    t, o = config.train, config.optimizer
    t.seq_len = 32_768  # [Z][P]
    config.model.max_position_embeddings = 32_768  # [I] the released value
    config.model.rope_theta = LONG_ROPE_THETA
    config.mesh.context = 8  # [I] CP over the 8 xGMI-connected GPUs of a node; data = 1024 / 8 = 128
    t.global_batch_size = 512  # 16.8M tokens per step, as at the end of phase 2 [I]
    t.steps = steps_for_tokens(2e12, t.seq_len, t.global_batch_size)
    o.schedule = "warmup_cosine"  # [I] re-warm to a lower peak, decay to 0 (final phase)
    o.learning_rate = o.adam_learning_rate = 0.3 * PEAK_LR
    o.warmup_steps = 500
    o.min_lr_ratio = 0.0
    set_mixture(
        config,
        {  # [I]
            "long": 0.30,  # documents ≥ 32k tokens: books, long papers, whole repositories
            "reasoning": 0.25,  # reasoning / chain-of-thought traces
            "web": 0.20,  # replay
            "code": 0.10,
            "math": 0.10,
            "stem": 0.05,
        },
    )


PHASES = {"phase1": phase1, "phase2": phase2, "phase3": phase3}  # variants of "base"
VARIANTS = (*GEOMETRY, *PHASES)


# ---------------------------------------------------------------------------- get_config(arg)
def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # an unquoted string


def _override(config: ml_collections.ConfigDict, item: str) -> None:
    """Apply one `section.field=value` extra (existing fields only)."""
    key, sep, text = item.partition("=")
    *path, field = key.strip().split(".")
    node = config
    try:
        for name in path:
            node = node[name]
        ok = bool(sep and path) and field in node
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(
            f"experiments/zaya1.py: extra {item!r} is not `section.field=value` for an existing field "
            "(e.g. tiny,train.steps=5)"
        )
    node[field] = _literal(text.strip())


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`arg` = "<variant>[,section.field=value,...]"; the variant is one of VARIANTS (default "base")."""
    name, *extras = (arg or "base").split(",")
    name = name.strip()
    if name not in VARIANTS:
        raise ConfigError(
            f"experiments/zaya1.py: unknown variant {name!r}; choose one of {VARIANTS} "
            "(e.g. --config=experiments/zaya1.py:tiny)"
        )
    config = variant("base" if name in PHASES else name)
    if name in PHASES:
        _common(config)
        PHASES[name](config)
    for item in extras:
        _override(config, item)
    return config
