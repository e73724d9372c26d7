"""Every config section's defaults and every choice name, in one place (no import of the rest of the package).

Each choice field has one tuple of allowed names here: `zaya_jax.config.validate` checks against it and
the code that dispatches on the name builds its table with `choice_table(NAMES, {...})`, so a name added
in one place and not the other fails at import time.
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections

# ---------------------------------------------------------------------------- choice names
DTYPES = ("float32", "bfloat16")
SKIP_OUTPUTS = ("scaled_input", "zero")  # "scaled_input" (legacy training code) | "zero" (HF-native)
# the integer sizes that define a ZAYA1 shape (checked, printed and compared by every tool that reads a model)
GEOMETRY_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
    "num_experts",
    "moe_intermediate_size",
    "router_hidden_size",
)
# MoE dispatch (how tokens reach their experts): "auto" resolves at trace time (model/moe.py) to one of the
# concrete ones; "dropless" runs the grouped expert GEMMs of `model.kernels.grouped_gemm`
DISPATCHES = ("auto", "dense", "dropless", "capacity", "ep", "ep_ragged")
CONCRETE_DISPATCHES = DISPATCHES[1:]
# dispatch names before `model.kernels` (configs and checkpoints written until then): each is now `dropless` with
# this grouped-GEMM kernel
RENAMED_DISPATCHES = {"grouped": "loops", "ragged": "ragged_dot"}
# the dispatches that never drop a token, on any layout (inference and evaluation run one of them; "auto" drops
# only where it resolves to "ep", under an expert axis > 1)
DROPLESS_DISPATCHES = ("dropless", "dense")
# Kernels (zaya_jax/kernels/): the platform a program is built for and one implementation per kernel; "auto"
# resolves once, when the model is built, from `model.kernels.platform` (docs/kernels.md)
KERNEL_PLATFORMS = ("auto", "cpu", "cuda", "rocm")
MATMUL_KERNELS = ("auto", "xla", "xla_cpu")  # xla_cpu: bf16 GEMMs in XLA:CPU's fast layout, residuals as bits
GROUPED_GEMM_KERNELS = ("auto", "loops", "ragged_dot", "ragged_dot_bf16", "tokamax")  # dropless expert GEMMs
# xla: chunked causal einsums; cudnn: fused (CUDA, bf16); pallas: Pallas Triton flash attention (ROCm/CUDA, bf16)
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "pallas")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
CONTEXT_LAYOUTS = ("contiguous", "zigzag")
SCHEDULES = ("warmup_cosine", "wsd", "constant")
DECAY_SHAPES = ("linear", "sqrt")  # WSD decay: linear | 1 − sqrt
PARAM_SHARDINGS = ("zero1", "fsdp", "replicated")
GRAD_REDUCE_DTYPES = DTYPES
ERROR_SHAPES = ("identity", "sign", "tanh")  # balancing controller error shape φ
GAIN_UNITS = ("logit", "probability")

DEFAULT_CORPUS_MAX_BYTES = 8 * 2**20  # bytes of standard-library source in the embedded default corpus


def choice_table(names: tuple[str, ...], table: Mapping[str, Any]) -> dict[str, Any]:
    """`table` ({name: implementation}) after checking it covers exactly `names` (a tuple above)."""
    if set(table) != set(names):
        raise AssertionError(f"dispatch table {sorted(table)} does not match the config's names {sorted(names)}")
    return dict(table)


CONTEXT_CHUNKS = choice_table(CONTEXT_LAYOUTS, {"contiguous": 1, "zigzag": 2})  # sequence chunks per device


# ---------------------------------------------------------------------------- sections
def model_config() -> ml_collections.ConfigDict:
    """ZAYA1 model fields (defaults = the released ZAYA1-base, docs/architecture.md §1)."""
    return ml_collections.ConfigDict(
        dict(
            vocab_size=262_272,
            hidden_size=2048,
            num_layers=40,  # decoder layers, each = CCA attention + MoE (legacy: 80 half-layers)
            num_q_heads=8,
            num_kv_heads=2,
            head_dim=128,
            cca_time0=2,  # depthwise conv kernel
            cca_time1=2,  # grouped conv kernel
            partial_rotary_factor=0.5,
            rope_theta=1e6,
            max_position_embeddings=32_768,
            rms_norm_eps=1e-5,
            qk_norm_eps=2.0**-7,  # floor of the q/k L2 norm (§9)
            num_experts=16,
            num_experts_per_tok=1,
            moe_intermediate_size=2048,
            router_hidden_size=256,
            skip_output="scaled_input",  # SKIP_OUTPUTS
            skip_bias_init=-1.0,
            dispatch="auto",  # DISPATCHES ("auto": see model/moe.py)
            # KERNEL_PLATFORMS, MATMUL_KERNELS, GROUPED_GEMM_KERNELS, ATTENTION_KERNELS ("auto": zaya_jax/kernels)
            kernels=dict(platform="auto", matmul="auto", grouped_gemm="auto", attention="auto"),
            # capacity / ep: slots per expert = cf * tokens / experts; ep_ragged: receive rows per device = cf * tokens
            capacity_factor=2.0,
            tie_word_embeddings=True,
            initializer_range=0.02,
            temp_init=1.0,  # key temperature init (§13.3 proposal; HF initialises 0)
            param_dtype="float32",  # DTYPES
            dtype="float32",  # compute dtype, DTYPES
            remat="none",  # REMAT_POLICIES
            attention_chunk=512,  # query block of causal attention (model/cca.py; 0 = the whole S×S square)
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        )
    )


def mesh_config() -> ml_collections.ConfigDict:
    """Device mesh sizes; -1 fills the remaining devices (at most one axis).

    context_layout: how the sequence is split over `context` (docs/architecture.md, context parallelism):
    "contiguous" (device i holds chunk i) or "zigzag" (2·context chunks, device i holds i and 2·context−1−i:
    causal attention work balanced, half the attention FLOPs).
    """
    return ml_collections.ConfigDict(dict(data=-1, expert=1, context=1, context_layout="contiguous"))


def optimizer_config() -> ml_collections.ConfigDict:
    """Muon (matrices) + AdamW (everything else) and the LR schedule (train/optimizer.py, train/schedule.py)."""
    return ml_collections.ConfigDict(
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
            schedule="warmup_cosine",  # SCHEDULES
            warmup_steps=100,
            decay_fraction=0.2,  # WSD: final fraction of steps spent decaying
            wsd_decay_shape="linear",  # WSD decay: DECAY_SHAPES
            min_lr_ratio=0.1,
        )
    )


def train_config() -> ml_collections.ConfigDict:
    """The training loop (train/loop.py)."""
    return ml_collections.ConfigDict(
        dict(
            steps=1000,
            seq_len=4096,
            global_batch_size=8,  # sequences per optimizer step
            microbatches=1,  # gradient accumulation
            # batch-size ramp: tuple of (start_step, global_batch_size); empty = constant batch
            batch_ramp=(),
            z_loss=0.0,
            seed=0,
            param_sharding="zero1",  # PARAM_SHARDINGS
            # dtype of the gradient reduce-scatter (ZeRO-1): "float32" (exact sums) or "bfloat16" (half the bytes)
            grad_reduce_dtype="float32",
            # ZeRO-1 with remat=full: reduce-scatter the Muon matrices' gradients chunk by chunk of <= 4 layers
            # inside the last micro-batch's backward, each beside the next chunk's GEMMs (no chunks where the
            # padding would be large, e.g. ZAYA1-base on 96+ devices); False = one reduce-scatter after the
            # backward pass, less memory (docs/parallelism.md "Overlap" has the GPU compiles and the A/B)
            overlap_collectives=False,
            # ZeRO-1 reduce-scatter, update and all-gather chunk by chunk of layers where that pads nothing
            # (`zero1.owners.update_chunks`), so each chunk's parameter all-gather runs under the later chunks'
            # Newton–Schulz on a GPU (docs/parallelism.md "Overlap"); False = one of each
            pipeline_update=True,
            loss_chunk=1024,  # sequence positions per cross-entropy chunk (tied head + log-softmax)
            log_every=10,
            # jax's persistent compilation cache: "" = $JAX_COMPILATION_CACHE_DIR if set, else <workdir>/xla_cache
            # (launchers without a workdir: ~/.cache/zaya_jax/xla_cache); "none" = off (launch/cli.py)
            compilation_cache_dir="",
            run_name="",  # TensorBoard run name (events in <workdir>/tensorboard/<run_name>); "" = workdir's name
            eval_every=0,
            eval_batches=4,
            # per-device peak TFLOP/s for the logged MFU; 0 = the hardware table (zaya_jax.hardware) for the
            # device kind and model.dtype; on CPU measure one with `python -m launch.bench --suite=gemm`
            peak_tflops=0.0,
        )
    )


def balancing_config() -> ml_collections.ConfigDict:
    """Expert balancing (train/balancing.py, docs/balancing.md): PI control of the router biases on the relative
    load error; per-slot gains start at ki and adapt between ki_min and ki_max (× gain_up while an error keeps its
    sign, × gain_down when it flips); gains in logit units (× 1/(E+1) on the probabilities); clipped integral;
    mean expert bias fixed."""
    return ml_collections.ConfigDict(
        dict(
            enabled=True,
            warm_start=True,  # step 0 sets β from the router's mean probabilities (train/balancing.py)
            kp=0.002,
            ki=0.002,
            ki_max=0.3,
            ki_min=1e-4,  # the gain's floor: a slot whose error keeps flipping slows down to it (fresh routers)
            gain_up=1.2,
            gain_down=0.5,
            error_shape="identity",  # ERROR_SHAPES
            tanh_tau=0.01,
            normalize_by_target=True,  # error relative to the target load: 1 − f/t
            gain_units="logit",  # GAIN_UNITS: "logit" (× 1/(E+1)) | "probability" (raw bias units)
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


def data_config() -> ml_collections.ConfigDict:
    """Training data (data/pipeline.py)."""
    return ml_collections.ConfigDict(
        dict(
            # prepared directories (launch/prepare_data.py); empty = the embedded default corpus
            # (the Python standard library sources), prepared on first use under `cache_dir`
            sources=(),
            weights=(),  # mixture weights, one per source; empty = uniform
            tokenizer="byte",  # "byte" or a local tokenizer.json (default corpus only)
            default_corpus_max_bytes=DEFAULT_CORPUS_MAX_BYTES,
            cache_dir="~/.cache/zaya_jax",
            eval_fraction=0.02,  # held-out rows of the default corpus
            shuffle_seed=0,
            prefetch=True,  # build the next batch in a background thread
        )
    )


def checkpoint_config() -> ml_collections.ConfigDict:
    """Checkpointing, loss guard and fault injection (checkpoint/trainer.py)."""
    return ml_collections.ConfigDict(
        dict(
            dir="",  # "" = <workdir>/checkpoints
            every=100,  # save every N optimizer steps (0 = only at the end, on preemption and on demand)
            keep=3,  # keep the newest K committed checkpoints ...
            keep_every=0,  # ... plus every step that is a multiple of M (0 = none)
            async_save=True,  # write in a background thread (device→host copy is still synchronous)
            save_initial=False,  # also save the freshly initialised state (step 0) of a run that starts fresh
            restore=True,  # resume from the newest committed checkpoint in `dir`
            nan_guard=True,  # non-finite loss / grad norm → roll back to the last good checkpoint
            spike_zscore=0.0,  # loss z-score over `spike_window` steps that counts as a spike (0 = off)
            spike_window=32,
            max_rollbacks=3,  # rollbacks onto one checkpoint before the run gives up
            faults="",  # fault injection, e.g. "crash@5,nan@12" (also env ZAYA_FAULTS; see checkpoint/faults.py)
        )
    )


SECTIONS = {
    "model": model_config,
    "mesh": mesh_config,
    "optimizer": optimizer_config,
    "train": train_config,
    "balancing": balancing_config,
    "data": data_config,
    "checkpoint": checkpoint_config,
}


def default_config() -> ml_collections.ConfigDict:
    """The full default tree: one section per entry of `SECTIONS`, every field defined."""
    config = ml_collections.ConfigDict()
    for name, make in SECTIONS.items():
        config[name] = make()
    return config
