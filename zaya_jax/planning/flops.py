"""FLOPs of one optimizer step as the compiled program executes them, from the config alone: the model FLOPs of
the MFU convention (6·N_active·tokens + causal attention, `zaya_jax.model.flops`) and, listed separately, the
extras XLA really runs on top of them (masked attention blocks, capacity padding, remat recompute, Muon's
Newton–Schulz iterations). The planner compares them with the dot FLOPs of the HLO (docs/planner.md).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from zaya_jax.config import REMAT_POLICIES, choice_table
from zaya_jax.kernels.attention import attention_chunks
from zaya_jax.model.flops import active_matmul_params, train_flops_per_token
from zaya_jax.model.moe import capacity
from zaya_jax.planning import projection


def effective_capacity_factor(config: ml_collections.ConfigDict, num_devices: int) -> float:
    """Expert-GEMM rows XLA computes per routed token: E·C / T (1.0 = exactly the top-1 active FLOPs)."""
    m, t = config.model, config.train
    tokens = t.global_batch_size // t.microbatches * t.seq_len
    if m.dispatch == "dense":  # (planned dropless runs `ep` at cf 1, see `abstract_step.planning_config`)
        return float(m.num_experts)
    local = tokens // num_devices if m.dispatch == "ep" else tokens
    return m.num_experts * capacity(local, m.num_experts, m.capacity_factor) / local


def analytic_flops(config: ml_collections.ConfigDict, num_devices: int, params: Any) -> dict[str, float]:
    """Global FLOPs per optimizer step: `model` = 6·N_active·T + causal attention (MFU convention) and the
    extras XLA executes on top of it (each listed; `hardware` = their sum)."""
    m, t = config.model, config.train
    seq, tokens = t.seq_len, t.global_batch_size * t.seq_len
    nl, h, i = m.num_layers, m.hidden_size, m.moe_intermediate_size
    cf = effective_capacity_factor(config, num_devices)
    attn_square = 4 * nl * m.num_q_heads * m.head_dim * seq  # QK + AV over the full S×S square
    # share of the square XLA computes: in the zigzag context layout the 2n+1 causally needed of the 4n²
    # (S/2n)² blocks per device (`zaya_jax.model.cca_context`); otherwise without context parallelism the
    # (n+1)/2n of n query blocks (`kernels.attention.causal_attention`), with a contiguous context split all of
    # it (masked)
    n_ctx = int(config.mesh.context)
    zigzag = n_ctx > 1 and config.mesh.context_layout == "zigzag"
    chunks = attention_chunks(seq, int(m.attention_chunk)) if n_ctx == 1 else 1
    square = (2 * n_ctx + 1) / (4 * n_ctx) if zigzag else (chunks + 1) / (2 * chunks)
    attn_fwd_full = square * attn_square
    expert_fwd = 2 * nl * 3 * h * i
    layers_fwd = 2 * (active_matmul_params(m) - m.vocab_size * h) + expert_fwd * (cf - 1) + attn_fwd_full
    recompute = choice_table(
        REMAT_POLICIES,
        {
            "none": 0.0,
            "dots": 0.0,
            "full": layers_fwd,
            "dots_no_batch": attn_fwd_full
            + expert_fwd * cf
            + 2 * nl * m.cca_time1 * (m.num_q_heads + m.num_kv_heads) * m.head_dim**2,
        },
    )[m.remat]
    out = {
        "model": train_flops_per_token(m, seq) * tokens,
        "attention_masked_half": 3 * (square - 0.5) * attn_square * tokens,
        "expert_capacity_padding": 3 * expert_fwd * (cf - 1) * tokens,
        "remat_recompute": recompute * tokens,
        "muon_newton_schulz": projection.ns_flops(params, config),
    }
    out["hardware"] = sum(out.values())
    return out
