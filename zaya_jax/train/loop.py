"""The training loop: config → mesh → model/optimizer → train step → loop → (checkpoint).

`train(config, workdir)` runs `config.train.steps` optimizer steps, logging every
`train.log_every` steps to JSONL + TensorBoard + a progress bar, and returns a summary dict with
the final held-out loss. Metrics are fetched from the device only on logging steps, so the host
never waits for the device in between (dispatch runs ahead). The progress bar's rate and ETA start after
the first step (its compilation is not stepping time).

Held-out loss (`eval_loss`, here, in metrics.jsonl, TensorBoard and the summary) is the mean cross-entropy
over the first `train.eval_batches` batches of the eval split, the same rows every time; `eval_tokens`
says how many tokens that is. `launch.eval` scores the whole split (or `--max_batches`), so its loss
differs by the sampling of the split, not by definition.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from tqdm import tqdm

from zaya_jax import kernels
from zaya_jax.data.corpus import unigram_entropy
from zaya_jax.data.pipeline import make_iterators
from zaya_jax.hardware import peak_flops
from zaya_jax.model.flops import train_flops_per_token
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train import health, schedule
from zaya_jax.train.metrics import MetricWriter, learning_rates, restart_rate_clock
from zaya_jax.train.microbatch import BATCH_KEYS, micro_loss
from zaya_jax.train.setup import prepare


def to_global(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
    """This process's rows [B/P, S] → global arrays [B, S] sharded over (data, expert) × context."""
    spec = NamedSharding(mesh, sharding.batch_spec(2))
    return {k: jax.make_array_from_process_local_data(spec, np.asarray(batch[k])) for k in BATCH_KEYS}


def make_eval_step(graphdef, mesh, config: ml_collections.ConfigDict):
    """Held-out loss sums (no gradients): (params, biases, batch) → (Σ CE, Σ tokens)."""

    @jax.jit
    def fn(params, biases, batch):
        _, (sums, _) = micro_loss(graphdef, params, biases, batch, config)
        return sums.ce, sums.tokens

    def run(state, batch):
        with jax.set_mesh(mesh):
            return fn(state.params, state.biases, batch)

    return run


def evaluate(eval_step, state, eval_iter, mesh, global_batch: int, num_batches: int) -> dict[str, float]:
    """{"eval_loss": mean held-out cross-entropy (nats/token), "eval_tokens": tokens scored} over the first
    `num_batches` eval batches."""
    eval_iter.reset()
    ce = tokens = 0.0
    for _ in range(num_batches):
        batch = eval_iter.next_batch(global_batch)
        if batch is None:
            break
        c, t = eval_step(state, to_global(batch, mesh))
        ce, tokens = ce + float(c), tokens + float(t)
    return {"eval_loss": ce / max(tokens, 1.0), "eval_tokens": int(tokens)}


MEASURE_PEAK_HINT = (
    "MFU is not reported: no peak for device kind {kind!r} in the hardware table "
    "(zaya_jax.hardware.HARDWARE). Measure one with `python -m launch.bench --suite=gemm` (the largest "
    "square GEMM's tflops_best, in TFLOP/s) and pass it as --config.train.peak_tflops=<value>"
)


def mesh_peak_flops(config: ml_collections.ConfigDict) -> float | None:
    """Peak FLOP/s of all the devices the step runs on, the denominator of MFU (no benchmark is run).

    Per device: `train.peak_tflops` when > 0, else the hardware table for the device kind and `model.dtype`
    (`zaya_jax.hardware.peak_flops`); None when neither is known (CPU). Accelerators count every device; emulated
    CPU devices share their host's cores, so on CPU a (measured) peak counts once per process.
    """
    device = jax.devices()[0]
    peak = float(config.train.peak_tflops) * 1e12 or peak_flops(device.device_kind, config.model.dtype)
    if not peak:
        return None
    return peak * (jax.process_count() if device.platform == "cpu" else jax.device_count())


def resumed_from(checkpointer: Any, step: int) -> str:
    """Where a run that starts at `step` > 0 came from, for its console line."""
    ckpt = getattr(checkpointer, "ckpt", None)
    return f"checkpoint {os.path.join(ckpt.directory, str(step))}" if ckpt is not None else "the given state"


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    checkpointer: Any = None,
    hooks: list[Callable] | None = None,
    quiet: bool = False,
) -> dict:
    """Run training; returns {'final_loss', 'eval_loss', 'steps', 'tokens_per_s', ...}."""
    t, hooks = config.train, hooks or []
    mesh = make_mesh(config)
    train_iter, eval_iter, data_dirs = make_iterators(config)
    training = prepare(config, mesh)
    state, step_fn, graphdef = training.state, training.step, training.graphdef
    if checkpointer is not None:
        state = checkpointer.restore_or_keep(state, training.shardings, train_iter, codec=training)
    eval_step = make_eval_step(graphdef, mesh, config)
    lr_fns = schedule.learning_rate_schedules(config)
    start = int(state.step)
    peak = mesh_peak_flops(config)
    writer = MetricWriter(workdir, run_name=t.run_name, start_step=start, mfu=peak is not None)
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    history = health.read_rows(metrics_path) if writer.enabled and start else []  # the balance window's rows
    monitor = health.BalanceMonitor(config.balancing, config.model)
    flops_per_token = train_flops_per_token(config.model, t.seq_len)
    if (note := schedule.warmup_note(config)) and jax.process_index() == 0:
        warnings.warn(note, stacklevel=2)
    if peak is None and jax.process_index() == 0:
        logging.info(MEASURE_PEAK_HINT.format(kind=jax.devices()[0].device_kind))
    show = not quiet and jax.process_index() == 0
    chosen = kernels.resolve(config.model)  # what the model was built with (docs/kernels.md)
    if show:
        if start:
            tqdm.write(f"resumed from step {start} ({resumed_from(checkpointer, start)})")
        tqdm.write(f"kernels: {kernels.describe(config.model)}")
        tqdm.write(health.LEGEND)
    bar = tqdm(total=t.steps, initial=start, disable=not show, unit="step", dynamic_ncols=True)
    last = {"time": time.perf_counter(), "step": start, "tokens": 0.0}
    row: dict = {}
    step = start
    while step < t.steps:
        global_batch = schedule.batch_size_at(step, t)
        state, metrics = step_fn(state, to_global(train_iter.next_batch(global_batch), mesh))
        if step == start:  # compiled and dispatched: the rate and ETA count from here
            restart_rate_clock(bar)
        last["tokens"] += global_batch * t.seq_len
        if (step + 1) % t.log_every == 0 or step + 1 == t.steps:
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            tps = last["tokens"] / max(now - last["time"], 1e-9)
            metrics.pop("lr", None)  # the step's Muon LR; both are logged from the host schedules
            metrics.update(tokens_per_s=tps, global_batch=global_batch, **learning_rates(lr_fns, step))
            if peak is not None:
                metrics["mfu"] = tps * flops_per_token / peak
            row = writer.write(step + 1, metrics)
            history = [r for r in history if r["step"] > step + 1 - health.BALANCE_WINDOW] + [row]  # the window only
            bar.set_postfix(health.progress_fields(row, tps, health.window_balance(history)))
            for msg in monitor.update(step + 1, row) if writer.enabled else ():
                with tqdm.external_write_mode():
                    logging.warning("%s", msg)
            last.update(time=now, step=step + 1, tokens=0.0)
        if t.eval_every and (step + 1) % t.eval_every == 0 and eval_iter is not None:
            writer.write(step + 1, evaluate(eval_step, state, eval_iter, mesh, global_batch, t.eval_batches))
        if checkpointer is not None:
            state = checkpointer.maybe_save(step + 1, state, train_iter, metrics)
            if checkpointer.resume_step is not None:  # rolled back (NaN/Inf loss or spike): go on from there
                step = bar.n = checkpointer.resume_step
                history = [r for r in history if r["step"] <= step]
                continue
        for hook in hooks:
            hook(step + 1, state, metrics)
        bar.update(1)
        step += 1
        if checkpointer is not None and checkpointer.stop_requested:  # preempted: saved; finish() closes
            break
    bar.close()
    last_loss = row.get("loss", writer.last("loss"))  # a resumed run that trained no step: the logged one
    summary = {"steps": int(state.step), "final_loss": math.nan if last_loss is None else last_loss}
    summary["kernels"] = str(chosen)
    preempted = checkpointer is not None and checkpointer.stop_requested  # saved; the grace period is short
    if eval_iter is not None and not preempted:
        held_out = {k: writer.last(k, step=int(state.step)) for k in ("eval_loss", "eval_tokens")}
        if held_out["eval_loss"] is None:  # not evaluated at this step already (eval_every)
            batch = schedule.batch_size_at(t.steps - 1, t)
            held_out = evaluate(eval_step, state, eval_iter, mesh, batch, t.eval_batches)
            writer.write(int(state.step), held_out)
        summary.update(held_out, eval_batches=int(t.eval_batches))
    summary["data"] = list(data_dirs)
    if len(data_dirs) == 1:
        summary["unigram_entropy"] = unigram_entropy(data_dirs[0])
    if checkpointer is not None:
        checkpointer.finish(int(state.step), state, train_iter)
    train_iter.close()
    writer.close()
    if writer.enabled and (balance := health.window_balance(health.read_rows(metrics_path))):
        summary["balanced"], summary["balance"] = balance["balanced"], balance  # = launch.balance_report's
    if writer.enabled and (png := health.plot_load_heatmap(metrics_path, os.path.join(workdir, "expert_load.png"))):
        summary["expert_load_png"] = png
    summary["state"] = state
    return summary
