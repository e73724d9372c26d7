"""Training throughput: our jitted train step vs transformers `ZayaForCausalLM`.

Both sides start from the same weights (the JAX initialisation, mapped to the HF-native names by
`zaya_jax.hf`), use the same optimizer (AdamW with the same hyper-parameters; no clipping) and see the
same batches, so their losses must agree step by step (the first one exactly up to float rounding). In one
process the steps run alternately (JAX, torch, JAX, torch, ...); `python -m benchmarks.peers` by default runs
each side alone in a fresh process, alternating, and pools the rounds (`pool_rounds`): two frameworks in one
process disturb each other. The ratio is of median step times. bfloat16 = bf16 operands with fp32
accumulation on our side, `torch.autocast("cpu", bfloat16)` on the reference's; master weights fp32 on both.

Semantics matched to the reference: `skip_output="zero"` (HF-native skip slot), balancing-bias
controller off (HF has none), a dropless dispatch (`model.dispatch` must not drop: the row records the
dropped fraction), loss = mean next-token CE over B·(S−1) tokens (the last position is masked).

MFU = model FLOPs/s (`zaya_jax.model.flops.train_flops_per_token`, the analytic 6·N_active + attention
count) / the GEMM peak of the compute dtype measured in the same run (`zaya_jax.bench.gemm.measure_gemm_peak`
on a 1024³ GEMM, fp32 accumulation, re-measured after every step and the median taken, since the load of a
shared host drifts). The
project's Muon optimizer can be timed as an extra row (`optimizers=("adamw", "muon")`): its Newton–Schulz
FLOPs are not model FLOPs and are not counted.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from benchmarks.peers import torch_ref
from zaya_jax import host_memory
from zaya_jax.bench import common, gemm
from zaya_jax.bench.inputs import make_batches, quick_model
from zaya_jax.config import validate
from zaya_jax.hf.io import model_arrays
from zaya_jax.model.flops import train_flops_per_token
from zaya_jax.model.params import param_counts
from zaya_jax.parallel import sharding
from zaya_jax.parallel.mesh import make_mesh
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import create_train_state
from zaya_jax.train.step import make_train_step

COLUMNS = (
    "impl",
    "optimizer",
    "dispatch",
    "dtype",
    "params_M",
    "batch",
    "seq",
    "tokens_per_step",
    "steps",
    "compile_s",
    "step_s_median",
    "step_s_min",
    "tokens_per_s",
    "ratio_vs_transformers",
    "flops_per_token",
    "model_gflops_per_s",
    "gemm_peak_gflops",
    "mfu",
    "loss_first",
    "loss_last",
    "max_abs_loss_diff",
    "dropped_fraction",
    "notes",
)
SIDES = ("zaya_jax", "transformers")


def bench_config(
    config: ml_collections.ConfigDict,
    *,
    quick: bool = False,
    batch: int | None = None,
    seq: int | None = None,
    dispatch: str | None = None,
    dtype: str | None = None,
    remat: str | None = None,
) -> ml_collections.ConfigDict:
    """A copy of `config` with the reference's semantics (see module docstring) and optional overrides.

    quick: a ~0.2M-parameter model, batch 4 × 64 (smoke tests)."""
    c = ml_collections.ConfigDict(config.to_dict())
    m, t = c.model, c.train
    if quick:
        m.update(quick_model())
        t.global_batch_size, t.seq_len = 4, 64
    m.skip_output = "zero"
    for name, value in (("dispatch", dispatch), ("dtype", dtype), ("remat", remat)):
        if value:
            m[name] = value
    if dtype:
        m.param_dtype = "float32"  # master weights stay fp32; `dtype` is the compute dtype
    t.global_batch_size, t.seq_len = batch or t.global_batch_size, seq or t.seq_len
    t.microbatches, t.z_loss = 1, 0.0
    c.balancing.enabled = False
    c.optimizer.grad_clip_norm = 0.0
    c.mesh.data, c.mesh.expert, c.mesh.context = -1, 1, 1
    return validate(c)


def adamw_hparams(config: ml_collections.ConfigDict) -> dict[str, Any]:
    o = config.optimizer
    return dict(
        lr=float(o.adam_learning_rate),
        betas=(float(o.adam_b1), float(o.adam_b2)),
        eps=float(o.adam_eps),
        weight_decay=float(o.weight_decay),
    )


class JaxTrainer:
    """Our train state + jitted step on `devices` (default: the first device). `timed_step(ids)` → (loss, s)."""

    def __init__(self, config: ml_collections.ConfigDict, optimizer: str = "adamw", devices: Sequence | None = None):
        self.config = config
        self.mesh = make_mesh(config, list(devices or jax.devices()[:1]))
        if optimizer == "adamw":
            h = adamw_hparams(config)
            self.tx = optax.adamw(
                h["lr"], b1=h["betas"][0], b2=h["betas"][1], eps=h["eps"], weight_decay=h["weight_decay"]
            )
        elif optimizer == "muon":
            self.tx = make_optimizer(config)
        else:
            raise ValueError(f"optimizer={optimizer!r}; choose 'adamw' or 'muon'")
        t0 = time.perf_counter()
        self.graphdef, self.state, shardings = create_train_state(config, self.mesh, self.tx)
        jax.block_until_ready(self.state)
        self.init_s = time.perf_counter() - t0
        self.step_fn = make_train_step(self.graphdef, self.tx, config, self.mesh, shardings)
        self.spec = NamedSharding(self.mesh, sharding.batch_spec(2))

    def arrays(self) -> dict[tuple, np.ndarray]:
        """The current params + balancing biases as NumPy, keyed by NNX path (call before the first step)."""
        return model_arrays(nnx.merge(self.graphdef, self.state.params, self.state.biases))

    def batch(self, ids: np.ndarray) -> dict[str, jax.Array]:
        ids = np.asarray(ids, np.int32)
        mask = np.ones(ids.shape, np.float32)
        mask[:, -1] = 0.0  # no next token for the last position (HF shifts inside the loss)
        host = dict(input_ids=ids, labels=np.roll(ids, -1, axis=1), loss_mask=mask)
        return {k: jax.device_put(v, self.spec) for k, v in host.items()}

    def timed_step(self, ids: np.ndarray) -> tuple[float, float, float]:
        """(loss, wall seconds, dropped fraction) of one step, host transfer of the batch included."""
        t0 = time.perf_counter()
        self.state, metrics = self.step_fn(self.state, self.batch(ids))
        loss = float(metrics["loss"])  # blocks until the step is done
        seconds = time.perf_counter() - t0
        return loss, seconds, float(np.mean(np.asarray(metrics["dropped_fraction"])))


def _row(
    impl: str,
    optimizer: str,
    config: ml_collections.ConfigDict,
    times: list[float],
    losses: list[float],
    compile_s: float,
    peak: float,
    notes: str,
    dropped: float = float("nan"),
) -> dict[str, Any]:
    m, t = config.model, config.train
    tokens = t.global_batch_size * t.seq_len
    fpt = train_flops_per_token(m, t.seq_len)
    med = statistics.median(times)
    tps = tokens / med
    return dict(
        impl=impl,
        optimizer=optimizer,
        dispatch=m.dispatch if impl == "zaya_jax" else "per-expert loop",
        dtype=m.dtype,  # the reference runs under torch.autocast when this is bfloat16
        params_M=param_counts(m)["total"] / 1e6,
        batch=t.global_batch_size,
        seq=t.seq_len,
        tokens_per_step=tokens,
        steps=len(times),
        compile_s=compile_s,
        step_s_median=med,
        step_s_min=min(times),
        tokens_per_s=tps,
        flops_per_token=fpt,
        model_gflops_per_s=tps * fpt / 1e9,
        gemm_peak_gflops=peak / 1e9,
        mfu=tps * fpt / peak,
        loss_first=losses[0],
        loss_last=losses[-1],
        dropped_fraction=dropped,
        notes=notes,
        _losses=losses,
        _times=list(times),
    )


def benchmark(
    config: ml_collections.ConfigDict,
    *,
    steps: int = 3,
    warmup: int = 1,
    optimizers: Sequence[str] = ("adamw",),
    reference: bool = True,
    gemm_size: int = 1024,
    sides: Sequence[str] = SIDES,
    log=print,
) -> list[dict[str, Any]]:
    """Rows for each JAX optimizer and (if available and `reference`) the transformers reference.

    `config` should come from `bench_config`. Steps alternate JAX / torch; the first `warmup` steps of each
    (compilation, allocator warm-up) are not timed but their losses are compared too. `sides` runs only
    one of the two (the JAX state is still created: it provides the reference's weights); see `pool_rounds`.
    """
    run_jax, reference = "zaya_jax" in sides, reference and "transformers" in sides
    gemm_dtype = jnp.dtype(config.model.dtype)  # MFU against the GEMM peak of the compute dtype
    peaks = [gemm.measure_gemm_peak(gemm_dtype, size=gemm_size, warmup=1, trials=3)]
    log(f"train: {gemm_dtype} GEMM peak {peaks[0] / 1e9:.1f} GFLOP/s ({gemm_size}^3; re-measured after every step)")
    t = config.train
    batches = make_batches(config.model.vocab_size, t.global_batch_size, t.seq_len, warmup + steps)
    ok, why = torch_ref.available()
    rows = []
    for k, optimizer in enumerate(optimizers):
        jt = JaxTrainer(config, optimizer)
        log(f"train: zaya_jax state ({optimizer}) created in {jt.init_s:.1f} s")
        tt = None
        if reference and ok and optimizer == "adamw":
            t0 = time.perf_counter()
            tt = torch_ref.TorchTrainer(
                config.model, jt.arrays(), autocast=config.model.dtype == "bfloat16", **adamw_hparams(config)
            )
            log(f"train: transformers model built in {time.perf_counter() - t0:.1f} s ({torch_ref.describe(tt)})")
        if not run_jax and tt is None:
            continue
        jl, jtimes, tl, ttimes, dropped = [], [], [], [], []
        jcompile = tcompile = 0.0
        for i, ids in enumerate(batches):
            if run_jax:
                loss, sec, drop = jt.timed_step(ids)
                jl.append(loss)
                dropped.append(drop)
                if i < warmup:
                    jcompile += sec
                else:
                    jtimes.append(sec)
            if tt is not None:
                loss, sec = tt.timed_step(ids)
                tl.append(loss)
                if i < warmup:
                    tcompile += sec
                else:
                    ttimes.append(sec)
            peaks.append(gemm.measure_gemm_peak(gemm_dtype, size=gemm_size, warmup=1, trials=2))
            log(
                f"train: step {i}{' (warm-up)' if i < warmup else ''}:"
                + (f" zaya_jax {jl[-1]:.5f} {jtimes[-1] if i >= warmup else jcompile:.2f} s" if run_jax else "")
                + (f" | transformers {tl[-1]:.5f} {ttimes[-1] if i >= warmup else tcompile:.2f} s" if tt else "")
            )
        peak = statistics.median(peaks)
        if tt is not None:
            rows.append(
                _row(
                    "transformers",
                    "adamw",
                    config,
                    ttimes,
                    tl,
                    tcompile,
                    peak,
                    f"{torch_ref.describe(tt)}; {host_memory.describe()}; first step (untimed) {tcompile:.1f} s",
                )
            )
        if run_jax:
            notes = (
                f"init {jt.init_s:.1f} s; mesh {dict(jt.mesh.shape)}; {host_memory.describe()}; "
                f"GEMM peak: median of {len(peaks)}"
            )
            rows.append(_row("zaya_jax", optimizer, config, jtimes, jl, jcompile, peak, notes, float(np.max(dropped))))
        del jt, tt
    if reference and not ok:
        rows.append(dict(impl="transformers", notes=f"not run: {why}"))
    return compare(rows)


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill `ratio_vs_transformers` (tokens/s ÷ the reference's) and `max_abs_loss_diff` (vs the reference's
    losses, step by step) in place; returns `rows`."""
    ref = next((r for r in rows if r["impl"] == "transformers" and "tokens_per_s" in r), None)
    for r in rows:
        if "tokens_per_s" in r:
            r["ratio_vs_transformers"] = common.ratio(r["tokens_per_s"], ref["tokens_per_s"]) if ref else float("nan")
        if ref is not None and r["impl"] == "zaya_jax" and r["optimizer"] == "adamw":
            diff = max(abs(a - b) for a, b in zip(r["_losses"], ref["_losses"]))
            r["max_abs_loss_diff"] = ref["max_abs_loss_diff"] = diff
    return rows


def pool_rounds(config: ml_collections.ConfigDict, rounds: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several runs (e.g. each side in its own process, alternating) → one row per (impl,
    optimizer) with all timed steps pooled (median over every step), GEMM peak = median of the runs'."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for rows in rounds:
        for r in rows:
            if "_times" in r:
                groups.setdefault((r["impl"], r["optimizer"]), []).append(r)
    pooled = []
    for (impl, optimizer), runs in groups.items():
        times = [t for r in runs for t in r["_times"]]
        peak = statistics.median(r["gemm_peak_gflops"] for r in runs) * 1e9
        notes = f"{len(runs)} separate runs pooled; first: {runs[0]['notes']}"
        dropped = max(float(r["dropped_fraction"]) for r in runs)
        pooled.append(
            _row(impl, optimizer, config, times, runs[0]["_losses"], runs[0]["compile_s"], peak, notes, dropped)
        )
    return compare(pooled)
