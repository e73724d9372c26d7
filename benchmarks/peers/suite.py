"""The peer comparisons that `python -m benchmarks.peers` runs (docs/benchmarks.md): per dtype, our train step
against transformers `ZayaForCausalLM` (`train`), each side alone in a fresh process for `separate_runs` rounds,
alternating, their step times pooled; the MaxText row (`maxtext`) outside quick runs; the report (train.csv,
train.md, train_rows.json) and one ratio line per dtype (ratios.txt).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from typing import Any, Sequence

import ml_collections

from benchmarks.peers import maxtext, train
from zaya_jax import host_memory
from zaya_jax.bench import common


@dataclasses.dataclass(frozen=True)
class Options:
    """What `python -m benchmarks.peers` was asked for (its flags of the same names; None = the suite's default)."""

    out: str
    dtypes: Sequence[str] = ("float32", "bfloat16")
    quick: bool = False
    batch: int | None = None
    seq_len: int | None = None
    dispatch: str | None = None
    remat: str | None = None
    trials: int | None = None
    warmup: int | None = None
    optimizers: Sequence[str] | None = None
    reference: bool = True
    separate_runs: int = 2
    train_side: str | None = None  # this process times only that side (a round of `separate_runs`)
    maxtext_python: str | None = None


def run(options: Options, config: ml_collections.ConfigDict) -> None:
    """Every dtype of `options` on the model of `config` (in a sub-directory per dtype when there are several);
    ends with one ratio line per dtype, printed and written to ratios.txt."""
    lines = []
    for dtype in options.dtypes:
        out = options.out if len(options.dtypes) == 1 else os.path.join(options.out, dtype)
        rows = run_dtype(options, config, dtype, out)
        ratio = next(
            (
                r["ratio_vs_transformers"]
                for r in rows
                if r["impl"] == "zaya_jax"
                and r.get("optimizer") == "adamw"
                and is_finite_positive(r.get("ratio_vs_transformers"))
            ),
            None,
        )
        if ratio is not None:
            lines.append(f"ratio vs transformers ({dtype}): {ratio:.2f}x")
    if lines and common.is_writer() and not options.train_side:
        with open(os.path.join(options.out, "ratios.txt"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


def run_dtype(options: Options, config: ml_collections.ConfigDict, dtype: str, out: str) -> list[dict[str, Any]]:
    """The report of one dtype: both sides (pooled over separate runs, or interleaved in this process) and,
    outside quick runs, the MaxText row with our step at MaxText's active FLOPs."""
    o = options
    config = train.bench_config(
        config, quick=o.quick, batch=o.batch, seq=o.seq_len, dispatch=o.dispatch, dtype=dtype, remat=o.remat
    )
    extra_rows, notes = [], []
    if not o.quick and not o.train_side:
        mt = maxtext.row(o.maxtext_python, dtype)
        extra_rows.append(mt)
        if "tokens_per_s" in mt:
            extra_rows.append(maxtext.matched_row(config, mt, steps=o.trials or 3))
    rows = None
    if o.separate_runs and not o.train_side:
        rows = train.pool_rounds(config, _separate_runs(o, dtype, out))
        notes.append(
            f"each side ran alone in its own process, {o.separate_runs} rounds"
            + (" alternating zaya_jax / transformers" if o.reference else "")
            + " (`--separate_runs`); step times pooled over the rounds"
        )
    return report(
        out,
        config,
        command=common.command_line(),
        steps=o.trials or (2 if o.quick else 3),
        warmup=o.warmup if o.warmup is not None else 1,
        optimizers=o.optimizers or (["adamw"] if o.quick else ["adamw", "muon"]),
        reference=o.reference,
        gemm_size=256 if o.quick else 1024,
        extra_rows=extra_rows,
        extra_notes=notes,
        rows=rows,
        sides=[o.train_side] if o.train_side else train.SIDES,
    )


def _separate_runs(options: Options, dtype: str, out_dir: str) -> list[list[dict[str, Any]]]:
    """Re-run this process's command once per side and round, each in a fresh process; their rows
    (train_rows.json)."""
    rounds = []
    for r in range(options.separate_runs):
        for side in train.SIDES if options.reference else ("zaya_jax",):
            out = os.path.join(out_dir, "runs", f"{r}_{side}")
            cmd = [sys.executable, *sys.orig_argv[1:], f"--train_side={side}", f"--out={out}", f"--dtype={dtype}"]
            print(f"train: round {r} {side} ({dtype}): {' '.join(cmd[1:])}", flush=True)
            # each side in its own best setting: our launchers' huge-page malloc tunable slows PyTorch down
            env = host_memory.default_malloc_env() if side == "transformers" else None
            subprocess.run(cmd, check=True, env=env)
            with open(os.path.join(out, "train_rows.json"), encoding="utf-8") as fh:
                rounds.append(json.load(fh))
    return rounds


TABLE_COLUMNS = (
    "impl",
    "optimizer",
    "dispatch",
    "dtype",
    "step_s_median",
    "step_s_min",
    "tokens_per_s",
    "ratio_vs_transformers",
    "mfu",
    "compile_s",
    "loss_first",
    "loss_last",
    "max_abs_loss_diff",
    "dropped_fraction",
)


def sections(rows: Sequence[dict[str, Any]], config: ml_collections.ConfigDict, extra: Sequence[str] = ()) -> list:
    """Markdown (heading, body) sections around the results table: model geometry, losses per step, notes."""
    m = config.model
    geometry = (
        f"hidden {m.hidden_size}, {m.num_layers} layers, {m.num_q_heads} q / {m.num_kv_heads} kv heads of "
        f"{m.head_dim}, {m.num_experts} experts of width {m.moe_intermediate_size}, router "
        f"{m.router_hidden_size}, vocab {m.vocab_size}; batch {config.train.global_batch_size} x "
        f"{config.train.seq_len}"
    )
    losses = "\n".join(
        f"- {r['impl']} ({r.get('optimizer', '')}): " + ", ".join(f"{x:.5f}" for x in r.get("_losses", []))
        for r in rows
        if r.get("_losses")
    )
    notes = "\n".join(f"- {r['impl']}: {r.get('notes', '')}" for r in rows)
    return [
        ("Model", geometry),
        ("Losses per step (warm-up included)", losses),
        ("Implementations", notes + "\n" + "\n".join(extra)),
    ]


def report(
    out_dir: str,
    config: ml_collections.ConfigDict,
    *,
    command: str | None = None,
    extra_rows: Sequence[dict[str, Any]] = (),
    extra_notes: Sequence[str] = (),
    rows: Sequence[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """`train.benchmark(config, **kwargs)` (or the given `rows`) reported as train.csv / train.md, plus
    train_rows.json (rows with every step's time and loss, for `train.pool_rounds`)."""
    rows = list(train.benchmark(config, log=common.say, **kwargs) if rows is None else rows) + list(extra_rows)
    ratios = [
        f"{r['optimizer']}: ratio vs transformers: {r['ratio_vs_transformers']:.2f}x; MFU {r['mfu']:.1%}"
        for r in rows
        if r["impl"] == "zaya_jax" and is_finite_positive(r.get("ratio_vs_transformers"))
    ]
    common.report(
        out_dir,
        "train",
        rows,
        title="Training throughput vs transformers",
        table_columns=list(TABLE_COLUMNS),
        csv_columns=train.COLUMNS,
        sections=sections(rows, config, extra_notes),
        notes=ratios,
        command=command,
    )
    if common.is_writer():
        common.write_json(os.path.join(out_dir, "train_rows.json"), rows)
    return rows


def is_finite_positive(x: Any) -> bool:
    try:
        return math.isfinite(float(x)) and float(x) > 0
    except (TypeError, ValueError):
        return False
