"""MaxText (the JAX MoE reference stack) as an optional peer row for the train suite.

MaxText is never a project dependency: it needs Python ≥ 3.12 and its own venv
(`python3.12 -m venv mt && mt/bin/pip install "maxtext[tpu]==0.2.5"`, benchmarks/README.md). Given that venv's
python, `row()` runs its trainer on synthetic data with a Mixtral-style MoE decoder (MaxText has no
ZAYA1/CCA block) sized like the transformers comparison and reports its median step time over the steps after
the first three. Without a python, or when the run fails, the row says why instead of a number.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from typing import Any

import ml_collections

from benchmarks.peers import train

SETTINGS = dict(
    decoder_block="mixtral",
    base_emb_dim=256,
    base_num_decoder_layers=4,
    base_mlp_dim=512,
    base_moe_mlp_dim=512,
    num_experts=8,
    num_experts_per_tok=2,
    base_num_query_heads=4,
    base_num_kv_heads=2,
    head_dim=64,
    vocab_size=1024,
    max_target_length=256,
    per_device_batch_size=4,
    steps=10,
    enable_checkpointing="false",
    attention="dot_product",
    log_period=1,
    megablox="false",
    sparse_matmul="true",
    dataset_type="synthetic",
    hardware="cpu",
    skip_jax_distributed_system="true",
    dtype="float32",
)
SKIP_STEPS = 3
# our model at the same active FLOPs per token: top-1 of one 1024-wide expert = top-2 of 512-wide ones
MATCHED_ZAYA = dict(
    hidden_size=256,
    num_layers=4,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    num_experts=8,
    moe_intermediate_size=1024,
    router_hidden_size=64,
    vocab_size=1024,
    max_position_embeddings=256,
)


def flops_per_token() -> float:
    """Analytic training FLOPs per token of the MaxText run, counted like `zaya_jax.model.flops`:
    6 · (attention projections + top-k SwiGLU experts + router + untied head) + causal attention."""
    s = SETTINGS
    d, hd, nq, nkv = s["base_emb_dim"], s["head_dim"], s["base_num_query_heads"], s["base_num_kv_heads"]
    attn = d * nq * hd + 2 * d * nkv * hd + nq * hd * d
    experts = 3 * d * s["base_moe_mlp_dim"] * s["num_experts_per_tok"]
    per_layer = attn + experts + d * s["num_experts"]
    params = s["base_num_decoder_layers"] * per_layer + s["vocab_size"] * d
    return 6.0 * params + 6 * s["base_num_decoder_layers"] * nq * hd * s["max_target_length"]


def matched_config(config):
    """A copy of a bench config (`train.bench_config`) resized to MATCHED_ZAYA, batch 4 × 256 like MaxText's."""
    c = ml_collections.ConfigDict(config.to_dict())
    c.model.update(MATCHED_ZAYA)
    c.train.global_batch_size, c.train.seq_len = SETTINGS["per_device_batch_size"], SETTINGS["max_target_length"]
    return c


def matched_row(config, mt: dict[str, Any], steps: int = 3) -> dict[str, Any]:
    """Our step on `matched_config(config)`, alone in this process, as a row compared with MaxText's row `mt`
    (impl "zaya_jax (MaxText-matched)"; the ratios vs MaxText are printed and put in its notes)."""
    row = next(
        r
        for r in train.benchmark(matched_config(config), steps=steps, optimizers=("adamw",), reference=False)
        if r["impl"] == "zaya_jax"
    )
    ratio = row["tokens_per_s"] / mt["tokens_per_s"]
    flop_ratio = row["model_gflops_per_s"] / mt["model_gflops_per_s"]
    row.update(
        impl="zaya_jax (MaxText-matched)",
        ratio_vs_transformers=float("nan"),
        notes=f"ratio vs MaxText: {ratio:.2f}x tokens/s, {flop_ratio:.2f}x model FLOP/s "
        f"({row['flops_per_token'] / 1e6:.1f} vs {mt['flops_per_token'] / 1e6:.1f} MFLOP/token); "
        + ", ".join(f"{k} {v}" for k, v in MATCHED_ZAYA.items()),
    )
    print(f"train: ratio vs MaxText: {ratio:.2f}x tokens/s ({flop_ratio:.2f}x model FLOP/s)", flush=True)
    return row


def _package_dir(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"maxtext does not import in {python}: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


def row(python: str | None, dtype: str = "float32", timeout_s: int = 900) -> dict[str, Any]:
    """A train-suite row for MaxText (impl="maxtext") with activations in `dtype` (MaxText keeps fp32 weights),
    or a row whose `notes` say why it was not run."""
    settings = dict(SETTINGS, dtype=dtype)
    base = dict(impl="maxtext", optimizer="adamw", dispatch="sparse_matmul (ragged)", dtype=dtype)
    if not python:
        return dict(
            base,
            notes="not run: MaxText needs Python >= 3.12 and its own venv; pass "
            "--maxtext_python=<venv>/bin/python (install: benchmarks/README.md)",
        )
    try:
        pkg = _package_dir(python)
        with tempfile.TemporaryDirectory() as tmp:
            metrics = os.path.join(tmp, "metrics.jsonl")
            args = [
                python,
                "-m",
                "maxtext.trainers.pre_train.train",
                os.path.join(pkg, "configs", "base.yml"),
                "run_name=zaya_bench",
                f"base_output_directory={tmp}",
                f"metrics_file={metrics}",
                *(f"{k}={v}" for k, v in settings.items()),
            ]
            env = dict(
                os.environ,
                JAX_PLATFORMS="cpu",
                DECOUPLE_GCLOUD="TRUE",
                XLA_FLAGS="--xla_force_host_platform_device_count=1",
            )
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
            if proc.returncode != 0 or not os.path.exists(metrics):
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                return dict(base, notes=f"run failed (exit {proc.returncode}): {tail[0][:200]}")
            with open(metrics, encoding="utf-8") as f:
                steps = [json.loads(line) for line in f if line.strip()]
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
        return dict(base, notes=f"not run: {type(err).__name__}: {str(err)[:200]}")
    secs = [s["perf/step_time_seconds"] for s in steps[SKIP_STEPS:] if "perf/step_time_seconds" in s]
    if not secs:
        return dict(base, notes=f"no step times in the metrics file ({len(steps)} records)")
    tokens = SETTINGS["per_device_batch_size"] * SETTINGS["max_target_length"]
    med = statistics.median(secs)
    return dict(
        base,
        batch=SETTINGS["per_device_batch_size"],
        seq=SETTINGS["max_target_length"],
        tokens_per_step=tokens,
        steps=len(secs),
        step_s_median=med,
        step_s_min=min(secs),
        tokens_per_s=tokens / med,
        flops_per_token=flops_per_token(),
        model_gflops_per_s=tokens / med * flops_per_token() / 1e9,
        notes="Mixtral-style decoder, hidden 256, 4 layers, 8 experts top-2 of 512, vocab 1024 (MaxText "
        "has no CCA/ZAYA1 block); compare with the 'zaya_jax (MaxText-matched)' row",
    )
