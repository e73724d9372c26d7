"""The ZAYA1 router (§6): down-projection, EDA depth state, shared 3-layer GELU MLP, softmax over
experts + skip slot, balancing biases that change the choice only, unbiased gate.

Shapes: T tokens (any leading dims), H hidden, R router width, E experts (E + 1 router classes).
The four projections take compute-dtype operands and accumulate in fp32; everything between them
(bias, EDA, RMSNorm, GELU), the logits, softmax, p + β and the argmax are fp32 (§9).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zaya_jax.kernels import Kernels
from zaya_jax.model import layers


class Routing(NamedTuple):
    """Router outputs for x: [..., H].

    choice: [...] int32 in [0, E] (E = skip slot); gate: [...] fp32 unbiased probability of the
    choice; probs: [..., E+1] fp32; state: [..., R] fp32 pre-norm post-EDA state for the next router.
    """

    choice: jax.Array
    gate: jax.Array
    probs: jax.Array
    state: jax.Array


def choose(probs: jax.Array, bias: jax.Array) -> tuple[jax.Array, jax.Array]:
    """e* = argmax(stop_grad(p) + β) (ties → lowest index), g = p[e*] (gradient flows through g only).

    probs: [..., E+1] fp32, bias: [E+1] fp32 → (choice [...] int32, gate [...] fp32).
    """
    choice = jnp.argmax(jax.lax.stop_gradient(probs) + layers.lead(bias, probs.ndim), axis=-1).astype(jnp.int32)
    gate = jnp.take_along_axis(probs, choice[..., None], axis=-1)[..., 0]
    return choice, gate


class Router(nnx.Module):
    """One router per MoE sub-layer. `eda_scale` of the first layer exists (uniform scan) but is dead:
    the first router is called with a zero incoming state. `kernels`: the model's kernel choice (from `Zaya`)."""

    def __init__(self, m: ml_collections.ConfigDict, kernels: Kernels, *, rngs: nnx.Rngs):
        pd, std = layers.dtype_of(m.param_dtype), m.initializer_range
        h, r, classes = m.hidden_size, m.router_hidden_size, m.num_experts + 1
        self.eps = m.rms_norm_eps
        self.dtype = layers.dtype_of(m.dtype)
        self.kernels = kernels
        self.w_down = layers.normal_param(rngs, (h, r), std, pd, ("embed", "router"))
        self.b_down = layers.const_param((r,), 0.0, pd, ("router",))
        self.eda_scale = layers.const_param((r,), 1.0, pd, ("router",))
        self.norm = layers.const_param((r,), 1.0, pd, ("router",))
        self.w1 = layers.normal_param(rngs, (r, r), std, pd, ("router", "router_out"))
        self.b1 = layers.const_param((r,), 0.0, pd, ("router_out",))
        self.w2 = layers.normal_param(rngs, (r, r), std, pd, ("router", "router_out"))
        self.b2 = layers.const_param((r,), 0.0, pd, ("router_out",))
        self.w3 = layers.normal_param(rngs, (r, classes), std, pd, ("router", "classes"))
        bias = jnp.zeros((classes,), jnp.float32).at[-1].set(m.skip_bias_init)
        self.balancing_bias = layers.BalancingBias(bias, out_sharding=("classes",), eager_sharding=False)

    def __call__(self, x: jax.Array, state_prev: jax.Array) -> Routing:
        """x: [..., H] normed MoE input; state_prev: [..., R] fp32 (zeros for the first MoE layer)."""
        f32 = lambda v: layers.lead(v[...].astype(jnp.float32), x.ndim)  # noqa: E731 (params [D] → [1.., D])
        dt, mm = self.dtype, self.kernels.linear
        a = mm(x, self.w_down[...], dt)
        a = a + f32(self.b_down)
        a = a + f32(self.eda_scale) * state_prev
        u = layers.rms_norm(a, f32(self.norm), self.eps, jnp.float32)
        u = jax.nn.gelu(mm(u, self.w1[...], dt) + f32(self.b1), approximate=False)
        u = jax.nn.gelu(mm(u, self.w2[...], dt) + f32(self.b2), approximate=False)
        probs = jax.nn.softmax(mm(u, self.w3[...], dt), axis=-1)
        choice, gate = choose(probs, self.balancing_bias[...].astype(jnp.float32))
        return Routing(choice, gate, probs, a)
