"""Config + mesh → the train state, its step function and its checkpoint form, for every parameter sharding.

`prepare(config, mesh)` is what the training loop (and tests) call; `prepare_abstract` gives the same with
`jax.ShapeDtypeStruct` leaves (nothing allocated) for the planner. `train.param_sharding`:

* `zero1` (default; arXiv 2511.17127 §2): `zaya_jax.train.zero1.step` — replicated compute-dtype parameters,
  gradients reduce-scattered to their owners, distributed Muon, parameters all-gathered. Checkpoints hold the
  canonical per-parameter state (`Training.to_checkpoint` / `from_checkpoint` convert).
* `fsdp` / `replicated`: `zaya_jax.train.step` under GSPMD on the per-parameter state itself.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import ml_collections
from jax.sharding import Mesh

from zaya_jax.train import schedule
from zaya_jax.train.optimizer import make_optimizer
from zaya_jax.train.state import abstract_train_state, create_train_state
from zaya_jax.train.step import make_train_step
from zaya_jax.train.zero1 import state as zero1_state
from zaya_jax.train.zero1.step import make_zero1_train_step


class Training(NamedTuple):
    graphdef: Any
    state: Any  # Zero1State (zero1) or TrainState
    shardings: Any  # of `state`
    step: Callable  # step(state, batch) -> (state, metrics); `.jitted` is the jax.jit function
    checkpoint_target: Any  # abstract canonical TrainState with shardings: what checkpoints store / restore into
    to_checkpoint: Callable  # state -> canonical TrainState
    from_checkpoint: Callable  # canonical TrainState -> state
    zero1: Any = None  # zaya_jax.train.zero1.state.Zero1Setup of a ZeRO-1 run (owner layouts, shardings)


def _identity(x):
    return x


def _build(config: ml_collections.ConfigDict, mesh: Mesh, model: Any, abstract: bool) -> Training:
    tx, lr_fn = make_optimizer(config), schedule.learning_rate_schedules(config)["muon"]
    if config.train.param_sharding == "zero1":
        if abstract:
            graphdef, setup, state = zero1_state.zero1_setup(config, mesh, tx)
        else:
            graphdef, setup, state = zero1_state.create_zero1_state(config, mesh, tx, model)
        step = make_zero1_train_step(graphdef, setup, config, mesh, lr_fn)
        return Training(
            graphdef,
            state,
            setup.shardings,
            step,
            setup.abstract_canonical,
            setup.to_canonical,
            setup.from_canonical,
            setup,
        )
    graphdef, abs_state, shardings = abstract_train_state(config, mesh, tx)
    state = abs_state if abstract else create_train_state(config, mesh, tx, model)[1]
    step = make_train_step(graphdef, tx, config, mesh, shardings, lr_fn)
    return Training(graphdef, state, shardings, step, abs_state, _identity, _identity)


def prepare(config: ml_collections.ConfigDict, mesh: Mesh, model: Any = None) -> Training:
    """The step-0 state (fresh with `train.seed`, or `model`'s weights) built in its shardings, and its step."""
    return _build(config, mesh, model, abstract=False)


def prepare_abstract(config: ml_collections.ConfigDict, mesh: Mesh) -> Training:
    """`prepare` with an abstract state (ShapeDtypeStructs carrying shardings): for `.lower()` / planning."""
    return _build(config, mesh, None, abstract=True)
