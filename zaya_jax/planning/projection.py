"""Analytic side of the planner's step-time projection (arXiv 2511.17127 §2–3: DP + ZeRO-1 + distributed
Muon on 1024 MI300X): HBM bytes of the memory-bound passes, the ZeRO-1 collective minimum, and the
projected step time / MFU.

**Memory-bound bytes** (per device per optimizer step). XLA:CPU's program traffic (`hlo_stats.hbm_bytes`)
fuses little and materialises the S×S attention logits, so it is only an upper bound; this model counts what
an accelerator with fused kernels moves. GEMM operands and outputs (projections, experts, router, LM head,
attention in a fused flash-style kernel with no S×S HBM traffic) are *not* counted: their time is the compute
term (executed FLOPs at the bf16 peak). Counted, per token and decoder layer in the forward pass (H hidden,
C = (n_q + n_kv)·d packed q‖k channels, R router width, E experts, I expert width, b compute-dtype bytes,
residual stream fp32, cf = expert rows per routed token, every token assumed routed):

| pass | bytes per token per layer |
|---|---|
| 2 RMSNorms (read fp32 residual, write normed) | 2·(4 + b)·H |
| 2 residual merges (read block output + residual, write residual) | 2·(b + 8)·H |
| CCA conv/mean path: conv1 (read c, write y + mean path), post-conv2 add (read z + mean path, write q‖k) | 6·b·C |
| CCA value shift (read x, write x shifted by one token) | 2·b·H |
| CCA q/k L2 norm + temperature + RoPE (read compute dtype, write fp32) | (b + 4)·C |
| router in fp32: EDA add, RMSNorm, 2 × bias+GELU, softmax and choice over E + 1 | 36·R + 12·(E + 1) |
| dispatch: pack tokens into expert rows, unpack and gate | 2·b·H·(1 + cf) |
| SwiGLU activation (read gate‖up, write) | 3·b·I·cf |

The backward pass of these elementwise ops moves `BACKWARD_FACTOR` = 2× the forward bytes (it reads the
saved input and the output cotangent and writes the input cotangent); remat ≠ none recomputes the forward
once more. Per token outside the layers: embedding gather (b·H read, 4·H written) and its scatter-add
backward (3 × 4·H), the final norm (3 × (4 + b)·H), and the loss over the vocabulary V on fp32 logits:
one read for the log-sum-exp, one read + a compute-dtype write for d logits = (8 + b)·V.

Per step: gradient accumulation over micro-batches reads and writes the fp32 gradient of every local
parameter once per micro-batch after the first, and a cast to `train.grad_reduce_dtype` (when it is not
fp32) reads 4 and writes b_g bytes per local parameter before the reduce-scatter. The optimizer update of
this device's ZeRO-1 shard (1/n of every parameter): read the gradient shard (b_g; again for the global
norm when clipping), the fp32 master (read + write), Muon momentum (read + write, + the Newton–Schulz input
and output) or Adam's two moments (read + write), and write the compute-dtype copy that is all-gathered.
Newton–Schulz operand traffic per [m ≤ n] matrix (fused kernel: X·Xᵀ, A·A with the bA + cA² epilogue,
B·X with the aX + BX epilogue): steps·(3mn + 4m²) + 2mn (normalisation) elements in fp32, for the share
of all Muon matrices this device actually orthogonalises (executed optimizer FLOPs / needed NS FLOPs).
Those are GEMM operands, so like the model's GEMMs their time is in the compute term except for what a
matrix moves beyond its own GEMM time at the device's ridge (small matrices: memory-bound); that exposed
part is what the memory-bound time charges.

**ZeRO-1 minimum** (wire bytes per device per step, busbw factors): reduce-scatter of every gradient in
`grad_reduce_dtype` + all-gather of every parameter in the compute dtype, each over the r devices holding
that parameter ((r − 1)/r; r = n for replicated parameters, n / expert-axis for expert kernels under EP),
plus, per micro-batch, the expert all-to-alls of EP (2 forward + 2 backward per MoE layer, + 2 with remat)
and the context-parallel collectives (per attention layer: K/V all-gather forward, its reduce-scatter
backward, + a re-gather with remat; halo permutes likewise).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from zaya_jax.config import CONTEXT_CHUNKS
from zaya_jax.hardware import Hardware
from zaya_jax.keys import leaf_name
from zaya_jax.model.cca import conv_halo_len
from zaya_jax.model.moe import capacity
from zaya_jax.planning.cluster import Cluster, Stage
from zaya_jax.train import optimizer as optimizer_lib

NS_DTYPE_BYTES = 4  # Newton–Schulz iterates in fp32 (`train.optimizer.orthogonalize`)
ACCUM_DTYPE_BYTES = 4  # micro-batch gradients are accumulated in fp32
MASTER_BYTES = 4  # fp32 master weights, Muon momentum and Adam moments
BACKWARD_FACTOR = 2.0  # elementwise VJPs move ≈ 2× the bytes of their forward op


def dtype_bytes(name: str) -> int:
    return jnp.dtype(name).itemsize


def grad_reduce_dtype(config: ml_collections.ConfigDict) -> str:
    return config.train.grad_reduce_dtype


def muon_matrices(params: Any, config: ml_collections.ConfigDict) -> Iterator[tuple[int, int, int]]:
    """(count, m, n) with m ≤ n for every class of whole matrix Muon orthogonalises; the fused expert w_in
    counts as two matrices with `muon_split_gate_up`."""
    o = config.optimizer
    labels = optimizer_lib.param_labels(params, muon_conv=bool(o.muon_conv))
    for (path, leaf), label in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(labels)):
        if label != "muon" or len(leaf.shape) < 2:
            continue
        *lead, rows, cols = leaf.shape
        count = math.prod(lead)
        if o.muon_split_gate_up and leaf_name(path) == optimizer_lib.SPLIT_LEAF:
            count, cols = 2 * count, cols // 2
        yield count, min(rows, cols), max(rows, cols)


def ns_flops(params: Any, config: ml_collections.ConfigDict) -> float:
    """Needed Newton–Schulz FLOPs per step (every Muon matrix once): per [m ≤ n] matrix and iteration X·Xᵀ
    (2m²n), A·A (2m³) and (bA + cA²)·X (2m²n)."""
    steps = int(config.optimizer.muon_ns_steps)
    return float(sum(c * steps * (4 * m * m * n + 2 * m**3) for c, m, n in muon_matrices(params, config)))


def ns_bytes(params: Any, config: ml_collections.ConfigDict, ridge: float = math.inf) -> tuple[float, float]:
    """Newton–Schulz operand bytes of every Muon matrix once (fused-kernel model, module docstring), and the
    part of them not hidden under the matrix's own GEMM time at a roofline `ridge` (FLOP/byte):
    Σ max(0, bytes − FLOPs / ridge) — large matrices are compute-bound, small ones memory-bound."""
    steps, operands, exposed = int(config.optimizer.muon_ns_steps), 0.0, 0.0
    for c, m, n in muon_matrices(params, config):
        nbytes = (steps * (3 * m * n + 4 * m * m) + 2 * m * n) * NS_DTYPE_BYTES
        operands += c * nbytes
        exposed += c * max(0.0, nbytes - steps * (4 * m * m * n + 2 * m**3) / ridge)
    return operands, exposed


def layer_bytes_per_token(m: ml_collections.ConfigDict, cf: float = 1.0) -> dict[str, float]:
    """Forward elementwise HBM bytes per token per decoder layer, by pass (module docstring table)."""
    b, h, c = dtype_bytes(m.dtype), m.hidden_size, (m.num_q_heads + m.num_kv_heads) * m.head_dim
    r, e, i = m.router_hidden_size, m.num_experts, m.moe_intermediate_size
    return {
        "norms": 2 * (4 + b) * h,
        "merges": 2 * (b + 8) * h,
        "cca": 6 * b * c + 2 * b * h + (b + 4) * c,
        "router": 36 * r + 12 * (e + 1),
        "dispatch": 2 * b * h * (1 + cf),
        "swiglu": 3 * b * i * cf,
    }


def describe() -> list[str]:
    """The assumptions of the analytic byte model, one line each (printed with every plan)."""
    return [
        f"elementwise backward = {BACKWARD_FACTOR:g} x forward bytes; remat recomputes the forward once; "
        "attention in a fused kernel (no S x S logits in HBM); every token routed to an expert",
        f"fp32 residual stream; gradients accumulated in {8 * ACCUM_DTYPE_BYTES}-bit over micro-batches; "
        f"master weights and moments {8 * MASTER_BYTES}-bit; Newton-Schulz in {8 * NS_DTYPE_BYTES}-bit",
        "GEMM operands/outputs (incl. Newton-Schulz beyond its exposed part) are in the compute term",
    ]


def recompute_passes(remat: str) -> float:
    return 0.0 if remat == "none" else 1.0


def hbm_traffic(
    config: ml_collections.ConfigDict,
    params: Any,
    num_devices: int,
    cf: float,
    ns_share: float,
    ridge: float = math.inf,
) -> dict[str, float]:
    """Analytic HBM bytes per device per optimizer step, by part, and their `total` (memory-bound bytes).

    cf: expert rows computed per routed token; ns_share: fraction of all Muon matrices this device
    orthogonalises (1/n when owners are balanced, 1 when every device runs all of Newton–Schulz); ridge:
    achieved FLOP/byte of the device — Newton–Schulz is a chain of GEMMs, so only its bytes beyond its own
    GEMM time count (`newton_schulz_exposed`; all its operand bytes are `newton_schulz_operands`, not in the
    total).
    """
    m, t, o = config.model, config.train, config.optimizer
    n, mb = num_devices, int(t.microbatches)
    tokens = t.global_batch_size * t.seq_len / n
    b, bg = dtype_bytes(m.dtype), dtype_bytes(grad_reduce_dtype(config))
    h = m.hidden_size
    layer = sum(layer_bytes_per_token(m, cf).values()) * m.num_layers
    fwd_bwd = 1.0 + BACKWARD_FACTOR
    labels = jax.tree.leaves(optimizer_lib.param_labels(params, muon_conv=bool(o.muon_conv)))
    leaves = jax.tree.leaves(params)
    local = sum(compute_copy(x, config, n)[0] for x in leaves)  # elements of this device's full gradient
    shard = {k: sum(math.prod(x.shape) for x, lab in zip(leaves, labels) if lab == k) / n for k in ("muon", "adam")}
    clip = bg if o.grad_clip_norm and o.grad_clip_norm > 0 else 0
    common = bg + clip + 2 * MASTER_BYTES + b  # gradient shard (+ norm), master read + write, compute copy
    out = {
        "layers_forward_backward": tokens * layer * fwd_bwd,
        "layers_recompute": tokens * layer * recompute_passes(m.remat),
        "embedding_norm_loss": tokens * ((b + 4) * h + 12 * h + 3 * (4 + b) * h + (8 + b) * m.vocab_size),
        "gradient_accumulation": (mb - 1) * 2 * ACCUM_DTYPE_BYTES * local,
        "gradient_cast": (ACCUM_DTYPE_BYTES + bg) * local if bg != ACCUM_DTYPE_BYTES else 0.0,
        "optimizer_update": shard["muon"] * (common + 2 * MASTER_BYTES + 2 * NS_DTYPE_BYTES)
        + shard["adam"] * (common + 4 * MASTER_BYTES),
    }
    operands, exposed = ns_bytes(params, config, ridge)
    out["newton_schulz_exposed"] = ns_share * exposed
    out["total"] = sum(out.values())
    out["newton_schulz_operands"] = ns_share * operands
    return out


def compute_copy(leaf: Any, config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int]:
    """(elements of a parameter's compute copy on one device, devices holding the same elements). ZeRO-1
    replicates parameters for compute except along mesh axis `expert`, which EP uses to shard expert kernels;
    how the parameter itself is stored (fp32, sharded for ZeRO-1 or FSDP) does not matter here."""
    spec = getattr(getattr(leaf, "sharding", None), "spec", None) or ()
    axes = {a for entry in spec if entry for a in (entry if isinstance(entry, tuple) else (entry,))}
    split = int(config.mesh.expert) if "expert" in axes else 1
    return math.prod(leaf.shape) // split, max(1, num_devices // split)


def zero1_minimum(
    config: ml_collections.ConfigDict, params: Any, num_devices: int, cluster: Cluster | None = None
) -> tuple[dict[str, float], dict[str, Stage]]:
    """Collective wire bytes per device per step the layout needs (module docstring), by part and `total`,
    and (with a `cluster`) the same collectives priced on it, by part. Device groups follow the mesh order
    (data, context, expert; expert innermost)."""
    m, t, mesh = config.model, config.train, config.mesh
    n, b, bg = num_devices, dtype_bytes(m.dtype), dtype_bytes(grad_reduce_dtype(config))
    n_ep, n_ctx = int(mesh.expert), int(mesh.context)
    cluster = cluster or Cluster()
    wire = dict.fromkeys(
        ("gradient_reduce_scatter", "parameter_all_gather", "expert_all_to_all", "context_parallel"), 0.0
    )
    time = {k: Stage() for k in wire}
    by_replicas: dict[int, int] = {}  # one bucket per replica group (the minimum pays each α once)
    for leaf in jax.tree.leaves(params):
        local, r = compute_copy(leaf, config, n)
        by_replicas[r] = by_replicas.get(r, 0) + local
    for r, local in by_replicas.items():
        group = range(0, n, n // r)  # replicated: every device; expert kernels: one expert shard's devices
        wire["gradient_reduce_scatter"] += (r - 1) / r * local * bg
        wire["parameter_all_gather"] += (r - 1) / r * local * b
        time["gradient_reduce_scatter"] += cluster.reduce_scatter(local * bg, group)
        time["parameter_all_gather"] += cluster.all_gather(local * b, group)
    mb, layers = int(t.microbatches), m.num_layers
    passes = 2.0 + recompute_passes(m.remat)  # forward + backward (+ recompute)
    tokens_local = t.global_batch_size // mb * t.seq_len // n  # per device per micro-batch
    if n_ep > 1:
        send = m.num_experts * capacity(tokens_local, m.num_experts, m.capacity_factor) * m.hidden_size * b
        runs = mb * layers * 2 * passes
        wire["expert_all_to_all"] = runs * (n_ep - 1) / n_ep * send
        time["expert_all_to_all"] = cluster.all_to_all(send, range(n_ep)).scale(runs)
    if n_ctx > 1:
        seqs = t.global_batch_size // mb // (int(mesh.data) * n_ep)  # sequences per device per micro-batch
        kv = seqs * t.seq_len * 2 * m.num_kv_heads * m.head_dim * b  # gathered K and V per layer
        chunks = CONTEXT_CHUNKS[mesh.context_layout]
        c = (m.num_q_heads + m.num_kv_heads) * m.head_dim
        halo = seqs * chunks * (conv_halo_len(m.cca_time0, m.cca_time1) * c + m.hidden_size) * b
        runs, ctx = mb * layers * passes, range(0, n_ctx * n_ep, n_ep)
        wire["context_parallel"] = runs * ((n_ctx - 1) / n_ctx * kv + halo)
        time["context_parallel"] = (cluster.all_gather(kv, ctx) + cluster.permute(halo, [(ctx[0], ctx[1])])).scale(runs)
    wire["total"] = sum(wire.values())
    return wire, time


def project(
    *,
    executed_flops: float,
    model_flops: float,
    tokens: float,
    hbm_bytes: float,
    collectives: dict[str, Stage],
    hw: Hardware,
    cluster: Cluster,
) -> dict[str, float]:
    """Per-device step time = compute + memory-bound + collectives (no overlap) and the MFU it implies.

    executed_flops / model_flops / tokens / hbm_bytes: per device per step; collectives: priced per kind.
    """
    compute_s = executed_flops / hw.peak_bf16_flops
    memory_s = hbm_bytes / (hw.hbm_bandwidth * cluster.hbm_efficiency)
    comm = sum(collectives.values(), Stage())
    step_s = compute_s + memory_s + comm.seconds
    return {
        "compute_s": compute_s,
        "memory_s": memory_s,
        "collective_s": comm.seconds,
        "collective_latency_s": comm.latency,
        "collective_xgmi_s": comm.xgmi,
        "collective_nic_s": comm.nic,
        "collective_by_kind_s": {k: v.seconds for k, v in sorted(collectives.items())},
        "step_s": step_s,
        "tokens_per_s_per_device": tokens / step_s,
        "mfu": model_flops / (step_s * hw.peak_bf16_flops),
    }
