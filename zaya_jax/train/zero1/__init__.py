"""ZeRO-1 with distributed Muon: the default train step (`train.param_sharding=zero1`; arXiv 2511.17127 §2,
docs/parallelism.md). Every device holds the parameters in the compute dtype; each parameter's optimizer work
(fp32 master weights, momentum / Adam moments, Newton–Schulz) lives on one *owner* device.

One step, in the order it runs (one `jax.shard_map` over every mesh axis, per device):

1. **local gradients** — forward/backward of the device's batch shard, micro-batches summed in fp32 straight
   into the owner layout (`step.py`: `local_grads`, the shared micro-batch loop of `zaya_jax.train.microbatch`);
   with `model.remat=full` the backward pass itself adds each layer's gradients into the layout
   (`fused_backward.py`);
2. **reduce-scatter** — the packed gradients to their owners, in `train.grad_reduce_dtype` (`step.py`; with
   `train.overlap_collectives` chunk by chunk of layers inside the last backward pass, `fused_backward.py`;
   else, with `train.pipeline_update`, chunk by chunk after it, so that steps 2–4 pipeline: chunk c's
   all-gather beside chunk c + 1's Newton–Schulz);
3. **owners' update** — global-norm clipping, Muon (momentum, Newton–Schulz on each owned matrix) and AdamW on
   the owned fp32 master weights (`update.py`);
4. **all-gather** — the updated parameters in the compute dtype, written into the previous ones (`step.py`);
5. **balancing and metrics** — the router-bias controller from the global expert counts and the step's
   metrics (`zaya_jax.train.step_metrics`, shared with the GSPMD step).

Where each part lives:

* `owners.py` — the owner layout itself, static (plain Python / NumPy from shapes): Muon matrices packed into
  owner *slots*, elementwise leaves into a *flat* vector, layer chunks for the overlapped reduce-scatter and
  the pipelined update;
* `layout.py` — that layout for the model of a config on a mesh (`build_layout`: parameter groups by the mesh
  axes they are replicated over) and `pack_*` / `unpack_*` between parameter-shaped trees and the layout;
* `state.py` — `Zero1State` (what the step carries), its shardings, and its checkpoint form: the canonical
  per-parameter `TrainState`, so a run restores onto any mesh;
* `fused_backward.py` — the layer stack's backward pass that accumulates (and reduce-scatters) in the layout;
* `update.py` — the owners' update (step 3);
* `step.py` — the step (steps 1–5 in order), `make_zero1_train_step`.

Why not sharding annotations alone (FSDP-style `NamedSharding`s that let XLA partition one global program,
as `zaya_jax.train.step` does for `fsdp`): distributed Muon orthogonalises each weight matrix *whole* — its
Newton–Schulz iterations multiply the full [rows, cols] matrix — so a matrix's optimizer work must sit on one
device, with different matrices (of different shapes, per layer and expert) spread over the devices for
balance. A sharding annotation splits every array along its dimensions, so each device would hold a slice
of every matrix and Newton–Schulz would need collectives inside every iteration. Assigning whole matrices to
owners, packing them into a per-device buffer and moving that buffer with an explicit reduce-scatter and
all-gather is what the owner layout and the `shard_map` express.
"""
