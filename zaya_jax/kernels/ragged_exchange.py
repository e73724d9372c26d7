"""The ragged all-to-all of dropless expert parallelism (`zaya_jax.model.expert_parallel`), per platform.

`ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis)` has the
semantics of `jax.lax.ragged_all_to_all` inside a manual `shard_map`: device i sends rows
operand[input_offsets[j] : input_offsets[j] + send_sizes[j]] to device j, which writes them at
output[output_offsets[j] ...] (offsets in the *receiver's* buffer); recv_sizes[i] is how many rows arrive from i.

* GPUs (CUDA, ROCm): `jax.lax.ragged_all_to_all`, one NCCL / RCCL exchange that moves only the rows sent
  (the GPU compiler emits `ragged-all-to-all`, forward and in the gradient).
* XLA:CPU has no ragged all-to-all (jax 0.10 to 0.12): the same exchange as a dense `all_to_all` of
  [n, rows, H] slots, each peer's rows padded to the whole operand, then placed at their offsets by a gather.
  It moves n× the bytes (fine for the emulated CPU devices of the tests) and computes the same result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ragged_all_to_all(platform: str, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis):
    """operand [R, H] → output [B, H] with the rows of every peer written at their offsets (module docstring);
    rows of `output` nothing is written to keep their value. Offsets and sizes: [n] int32."""
    if platform in ("cuda", "rocm"):
        return jax.lax.ragged_all_to_all(
            operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis_name=axis
        )
    return _padded_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis)


def _padded_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis):
    rows = operand.shape[0]
    idx = jnp.arange(rows)
    # slot j: this device's rows for peer j from its input offset on, then the receiver's offset for them
    take = jnp.minimum(input_offsets[:, None] + idx[None, :], rows - 1)  # [n, R]
    slots = jnp.where((idx[None, :] < send_sizes[:, None])[..., None], operand[take], 0)  # [n, R, H]
    recv = jax.lax.all_to_all(slots, axis, 0, 0, tiled=True)  # [n (source), R, H]
    where = jax.lax.all_to_all(output_offsets[:, None], axis, 0, 0, tiled=True)[:, 0]  # [n]: each source's offset
    # output row p takes row p − where[s] of source s if it lies inside that source's recv_sizes[s] rows
    p = jnp.arange(output.shape[0])
    inside = (p[None, :] >= where[:, None]) & (p[None, :] < (where + recv_sizes)[:, None])  # [n, B]
    source = jnp.argmax(inside, axis=0)
    row = jnp.clip(p - where[source], 0, rows - 1)
    return jnp.where(inside.any(axis=0)[:, None], recv[source, row], output)
