"""The ZAYA1 decoder (§2): embedding, input scaling, a `jax.lax.scan` over stacked decoder layers
(CCA + MoE, each with residual scaling), final RMSNorm and the tied LM head.

The residual stream is fp32; every matmul takes `model.dtype` operands and accumulates in fp32; logits are
fp32 (§9). Layer parameters
are stacked along a leading [L] axis, so compile time does not grow with depth.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.config import REMAT_POLICIES as REMAT_NAMES
from zaya_jax.config import choice_table
from zaya_jax.kernels import BATCHED_MATMUL, MATMUL, Kernels, resolve, resolved_config
from zaya_jax.model import cca_context, layers
from zaya_jax.model.cca import CCA, conv_halo_len
from zaya_jax.model.moe import EXPERT_WEIGHTS, MoE, MoEStats
from zaya_jax.parallel.mesh import in_manual_region

STACKED_AXIS = "layers"  # logical name of the leading axis of every per-layer parameter
REMAT_POLICIES = choice_table(
    REMAT_NAMES,
    {  # `Kernels.einsum` matmuls are saved by checkpoint name
        "none": None,  # no jax.checkpoint at all
        "full": None,
        "dots": jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.checkpoint_dots,
            jax.checkpoint_policies.save_only_these_names(MATMUL, BATCHED_MATMUL),
        ),
        "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            jax.checkpoint_policies.save_only_these_names(MATMUL),
        ),
    },
)


def cca_halo(m: ml_collections.ConfigDict) -> int:
    return conv_halo_len(m.cca_time0, m.cca_time1)


class DecoderLayer(nnx.Module):
    """One ZAYA1 decoder layer = CCA sub-layer + MoE sub-layer, HF-native bracketing (§2)."""

    def __init__(self, m: ml_collections.ConfigDict, kernels: Kernels, *, rngs: nnx.Rngs):
        pd, dt = layers.dtype_of(m.param_dtype), layers.dtype_of(m.dtype)
        self.attn_norm = layers.RMSNorm(m.hidden_size, m.rms_norm_eps, param_dtype=pd, dtype=dt)
        self.attn = CCA(m, kernels, rngs=rngs)
        self.attn_merge = layers.Merge(m.hidden_size, param_dtype=pd)
        self.moe_norm = layers.RMSNorm(m.hidden_size, m.rms_norm_eps, param_dtype=pd, dtype=dt)
        self.moe = MoE(m, kernels, rngs=rngs)
        self.moe_merge = layers.Merge(m.hidden_size, param_dtype=pd)

    def __call__(
        self,
        r: jax.Array,
        router_state: jax.Array,
        positions: jax.Array,
        context_layout: str | None = None,
        layer: jax.Array | None = None,
    ):
        """r: [B, S, H] fp32 residual, router_state: [B, S, R] fp32 → (r, router_state, MoEStats).

        context_layout: None → CCA over the whole (GSPMD-sharded) sequence; "contiguous" / "zigzag" →
        context-parallel CCA (`zaya_jax.model.cca_context`), tokens in that layout's order.
        layer: this layer's index when the expert weights are the whole stacks (`MoE.takes_whole_stacks`).
        """
        x = self.attn_norm(r)
        if context_layout is None:
            y = self.attn(x, positions)
        else:
            y = cca_context.cca_forward(self.attn, x, positions, context_layout)
        r = self.attn_merge(y, r)
        z, router_state, stats = self.moe(self.moe_norm(r), router_state, layer)
        return self.moe_merge(z, r), router_state, stats


def scan_layers(graphdef, stacked, r: jax.Array, a: jax.Array, positions: jax.Array, layout: str | None, remat: str):
    """The decoder stack as a `lax.scan` over the stacked layer variables (compile time flat in depth), with the
    `remat` policy. r: [B, S, H] fp32, a: [B, S, R] fp32 → (r, MoEStats stacked over layers).

    Where the MoE takes them (`MoE.takes_whole_stacks`), the expert weights stay out of the scanned variables:
    every layer gets the whole [L, E, ...] stacks and its index."""
    module = nnx.merge(graphdef, stacked)
    whole = module.moe.takes_whole_stacks()
    fixed = ()
    if whole:
        graphdef, experts, stacked = nnx.split(module, EXPERT_WEIGHTS, ...)
        fixed = (experts,)

    def body(carry, xs):
        index, layer_state = xs
        r, a, stats = nnx.merge(graphdef, *fixed, layer_state)(*carry, positions, layout, index if whole else None)
        return (r, a), stats

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat], prevent_cse=False)
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    (r, _), stats = jax.lax.scan(body, (r, a), (jnp.arange(num_layers, dtype=jnp.int32), stacked))
    return r, stats


# (graphdef, stacked layer variables, r, a, positions, layout, remat) -> (r, stats); see `scan_layers`
LayerRunner = Callable[..., tuple[jax.Array, "MoEStats"]]


class ForwardOutput(NamedTuple):
    logits: jax.Array  # [B, S, V] fp32
    stats: MoEStats  # counts [L, E+1], dropped [L]


def frozen(m: ml_collections.ConfigDict) -> ml_collections.FrozenConfigDict:
    """Modules keep a hashable copy of the model config (it becomes part of the static graph)."""
    return m if isinstance(m, ml_collections.FrozenConfigDict) else ml_collections.FrozenConfigDict(m)


def _stacked_layers(m: ml_collections.ConfigDict, kernels: Kernels, rngs: nnx.Rngs) -> DecoderLayer:
    """L independently initialised layers whose variables are stacked along a leading [L] axis."""
    keys = jax.random.split(rngs.params(), m.num_layers)
    graphdef = nnx.graphdef(abstract_module(lambda: DecoderLayer(m, kernels, rngs=nnx.Rngs(0))))
    state = jax.vmap(lambda k: nnx.state(DecoderLayer(m, kernels, rngs=nnx.Rngs(params=k))))(keys)
    for var in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):  # one more leading axis
        var.set_metadata(out_sharding=(STACKED_AXIS, *var.get_metadata()["out_sharding"]))
    return nnx.merge(graphdef, state)


class Zaya(nnx.Module):
    """ZAYA1 causal LM. `model(input_ids)` → logits [B, S, V]; `model.forward(...)` also gives MoE stats."""

    def __init__(self, m: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        m = resolved_config(m)  # the concrete kernel names, for every later reader of the config
        pd, dt = layers.dtype_of(m.param_dtype), layers.dtype_of(m.dtype)
        self.cfg = m
        self.kernels = resolve(m)  # the one place the choice is made: every sub-module is handed this
        self.embed = layers.normal_param(
            rngs, (m.vocab_size, m.hidden_size), m.initializer_range, pd, ("vocab", "embed")
        )
        self.in_scale = layers.const_param((m.hidden_size,), 1.0, pd, ("embed",))
        self.in_bias = layers.const_param((m.hidden_size,), 0.0, pd, ("embed",))
        self.layers = _stacked_layers(m, self.kernels, rngs)
        self.final_norm = layers.RMSNorm(m.hidden_size, m.rms_norm_eps, param_dtype=pd, dtype=dt)

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """Token embedding plus the input bias, times the input scale: [B, S] ids → fp32 residual [B, S, H]."""
        # gather from an fp32 view: the backward scatter-adds token cotangents in fp32, not in the compute dtype
        e = jnp.take(self.embed[...].astype(jnp.float32), input_ids, axis=0)
        return (e + layers.lead(self.in_bias[...].astype(jnp.float32), e.ndim)) * layers.lead(
            self.in_scale[...].astype(jnp.float32), e.ndim
        )

    def hidden_states(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        context_layout: str = "contiguous",
        run_layers: "LayerRunner | None" = None,
    ):
        """input_ids: [B, S] int → (final normed hidden [B, S, H] in compute dtype, MoEStats).

        Under an active mesh with a `context` axis > 1, CCA runs context-parallel in `context_layout`
        ("contiguous" | "zigzag", see `zaya_jax.model.cca_context`); for zigzag the layer stack runs in
        zigzag token order and the hidden state is returned in natural order. Results do not depend on it.
        run_layers: how the stacked layers run (default `scan_layers`); the ZeRO-1 step passes one whose
        backward pass accumulates parameter gradients straight into its reduce-scatter buffers.
        """
        m = self.cfg
        chex.assert_rank(input_ids, 2)
        b, s = input_ids.shape
        layout = cca_context.active_layout(b, s, context_layout, cca_halo(m))
        if layout is not None:
            input_ids = cca_context.to_layout(input_ids, layout)
            if positions is not None:
                positions = cca_context.to_layout(positions, layout)
            elif in_manual_region():  # this device's chunk(s) of the sequence
                positions = cca_context.local_positions(s, layout)
            else:
                positions = jnp.asarray(cca_context.layout_positions(s, cca_context.context_size(), layout))
        elif positions is None:
            positions = jnp.arange(s, dtype=jnp.int32)[None, :]
        r = self.embed_tokens(input_ids)
        router_state = jnp.zeros((b, s, m.router_hidden_size), jnp.float32)
        graphdef, stacked = nnx.split(self.layers)
        r, stats = (run_layers or scan_layers)(graphdef, stacked, r, router_state, positions, layout, m.remat)
        h = self.final_norm(r)
        return (h if layout is None else cca_context.from_layout(h, layout)), stats

    def logits(self, h: jax.Array) -> jax.Array:
        """Tied head: h [..., H] → fp32 logits [..., V] (compute-dtype operands, fp32 accumulation)."""
        return self.kernels.linear(h, self.embed[...].T, layers.dtype_of(self.cfg.dtype))

    def forward(
        self, input_ids: jax.Array, positions: jax.Array | None = None, context_layout: str = "contiguous"
    ) -> ForwardOutput:
        h, stats = self.hidden_states(input_ids, positions, context_layout)
        return ForwardOutput(self.logits(h), stats)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        return self.forward(input_ids).logits


def init_model(m: ml_collections.ConfigDict, seed: int = 0) -> Zaya:
    """A randomly initialised model (allocates the weights)."""
    return Zaya(m, rngs=nnx.Rngs(params=seed))


def abstract_model(m: ml_collections.ConfigDict) -> Zaya:
    """The model with `jax.ShapeDtypeStruct` leaves: shapes and dtypes only, nothing allocated."""
    return abstract_module(lambda: Zaya(m, rngs=nnx.Rngs(params=0)))


def abstract_module(make):
    """`make()`'s module with `jax.ShapeDtypeStruct` leaves. Unlike `nnx.eval_shape` this never turns the
    parameters' logical axis names into shardings of an active mesh (they are not mesh axes)."""
    graph = {}

    def state():
        graph["def"], values = nnx.split(make())
        return values

    values = jax.eval_shape(state)
    return nnx.merge(graph["def"], values)
