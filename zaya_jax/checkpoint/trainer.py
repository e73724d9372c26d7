"""`TrainCheckpointer`: checkpointing and in-process fault tolerance for `zaya_jax.train.loop.train`.

The loop calls, in order:
    state = ckpt.restore_or_keep(state, state_shardings, train_iter)   # resume onto the current mesh
    state = ckpt.maybe_save(step, state, train_iter, metrics)          # after every step
        → ckpt.resume_step is not None: rolled back, continue from that step
        → ckpt.stop_requested: preempted (already saved), leave the loop
    ckpt.finish(step, state, train_iter)                               # final save, wait, retention

Per step: injected metric faults → loss guard (NaN/Inf, z-score spike; the previous step's metrics are
checked lazily so the host does not wait for the device, except at save steps and the last step) →
periodic async save → injected process faults → preemption. A rollback restores the newest
committed checkpoint and keeps the data iterator where it is, so the batches since that checkpoint
(including the offending one) are skipped. SIGTERM/SIGINT finish the step, save, and stop the loop: the
signal is only noted when it arrives and acted on at one point of `maybe_save` (after the periodic save),
so `stop_requested` never changes between that point and the loop's check of it. A second SIGINT stops at once
(the SIGINT handler installed before the trainer's, else KeyboardInterrupt), except inside a checkpoint write, where
it waits until the save has been handed to Orbax (and `abort` lets it commit). In multi-process runs jax's
preemption service handles SIGTERM instead (`jax.experimental.multihost_utils.reached_preemption_sync_point`).

Restores (at start and on rollback) take the newest committed step that reads back intact: a step with a
missing, truncated or bit-rotted file (checksums, see `integrity`) is moved to `<dir>.corrupt/`, reported on
the console and in the event log, and the previous step is tried.

The workdir and the checkpoint directory are locked (`lock.DirLock`) from construction to `finish` /
`abort`, so a second trainer on the same directories stops with one line instead of deleting this one's
in-flight saves.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import threading
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.experimental import multihost_utils

from zaya_jax import kernels
from zaya_jax.checkpoint import faults as faults_lib
from zaya_jax.checkpoint.errors import CheckpointConfigError, CheckpointError, CorruptCheckpointError
from zaya_jax.checkpoint.events import EVENT_LOG_ENV, HEARTBEAT_ENV, EventLog, Heartbeat
from zaya_jax.checkpoint.guard import LossGuard
from zaya_jax.checkpoint.lock import DirLock
from zaya_jax.checkpoint.manager import Checkpointer, abstract_target, tree_nbytes
from zaya_jax.checkpoint.orphan import watch_supervisor
from zaya_jax.checkpoint.resume_diff import check_resumable, config_changes, describe
from zaya_jax.config import validate_checkpoint


def _identity(x):
    return x


def checkpoint_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
    return os.path.abspath(os.path.expanduser(config.checkpoint.dir or os.path.join(workdir, "checkpoints")))


class TrainCheckpointer:
    """The training loop's checkpoint / fault-tolerance object (protocol in the module docstring)."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        *,
        events: EventLog | None = None,
        heartbeat: Heartbeat | None = None,
        handle_signals: bool = True,
    ):
        validate_checkpoint(config.checkpoint)
        c = config.checkpoint
        self.config, self.workdir, self.every = config, workdir, int(c.every)
        primary = jax.process_index() == 0
        self.lock = DirLock({"workdir": workdir, "checkpoint directory": checkpoint_dir(config, workdir)}, "train")
        stale = self.lock.acquire() if primary else []
        try:
            log_path = os.environ.get(EVENT_LOG_ENV) or os.path.join(workdir, "events.jsonl")
            self.events = events or EventLog(log_path, "trainer", enabled=primary)
            for rec in stale:
                self.events.write("lock_takeover", path=rec["path"], previous={k: rec.get(k) for k in ("host", "pid")})
            # a supervisor per node (launch/rocm) sets $ZAYA_HEARTBEAT_FILE for its own process: beat there too
            beat = primary or bool(os.environ.get(HEARTBEAT_ENV))
            self.heartbeat = heartbeat or Heartbeat.for_workdir(workdir, int(config.train.steps), enabled=beat)
            self.ckpt = Checkpointer(
                checkpoint_dir(config, workdir),
                keep=c.keep,
                keep_every=c.keep_every,
                async_save=c.async_save,
                events=self.events,
            )
            self.faults = faults_lib.FaultInjector.from_config(config, workdir, self.events)
        except BaseException:
            self.lock.release()
            raise
        self.guard = LossGuard(nan_guard=c.nan_guard, spike_zscore=c.spike_zscore, window=c.spike_window)
        self.max_rollbacks = int(c.max_rollbacks)
        self.resume_step: int | None = None
        self.stop_requested, self.stop_signal = False, None
        self._signal_received = False  # multi-process: acted on only at a step all processes agree on
        # multi-process: jax's preemption sync manager (started by jax.distributed.initialize) catches SIGTERM
        # on any process and picks the step all processes stop at; it is asked once per `maybe_save` call
        self._multi_process = jax.process_count() > 1
        self._sync_calls = 0
        self._target = self._shardings = None
        self._encode = self._decode = _identity  # run state <-> checkpointed state (see restore_or_keep)
        self._pending: tuple[int, Any] | None = None
        self._last_saved: int | None = None
        self._rollbacks: collections.Counter = collections.Counter()
        self._resume_changes: dict = {}  # config fields that differ from the restored checkpoint's
        self._old_handlers: dict = {}
        self.interrupted = False  # a second SIGINT arrived (stop at once)
        self._writing = 0  # > 0 while a checkpoint write is being started or waited for (see `_write_section`)
        self._interrupt_pending = False
        if handle_signals and not self._multi_process and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        watch_supervisor()  # no-op unless launch.supervise started us (and the launcher has not started it)

    # ---- signals ---------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        if (self.stop_requested or self._signal_received) and signum == signal.SIGINT:
            self.interrupted = True  # a second Ctrl-C stops at once, but never in the middle of a checkpoint write
            if self._writing:
                self._interrupt_pending = True  # raised when the write section ends (`_write_section`)
            else:
                self._interrupt(frame)
            return
        self.stop_signal = signal.Signals(signum).name
        self._signal_received = True  # acted on in `_agree_on_stop`, never in between

    def _interrupt(self, frame=None) -> None:
        """Stop at once: the SIGINT handler that was installed before ours (a launcher's records the interruption,
        `launch.cli`), else KeyboardInterrupt."""
        previous = self._old_handlers.get(signal.SIGINT)
        if callable(previous):
            previous(signal.SIGINT, frame)
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def _write_section(self, *, interruptible: bool = True):
        """A checkpoint save being started or waited for: a second SIGINT arriving inside is acted on when it
        ends, so the save is handed to Orbax whole and commits (`abort` waits for it). `interruptible=False`
        (`abort`, already stopping): the deferred interrupt is dropped."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if not self._writing and self._interrupt_pending:
            self._interrupt_pending = False
            if interruptible:
                self._interrupt()

    def _agree_on_stop(self, step: int) -> None:
        """The one place `stop_requested` is set. Single process: a SIGTERM/SIGINT noted by `_on_signal`.
        Multi-process: `multihost_utils.reached_preemption_sync_point` — jax's preemption service propagates a
        SIGTERM received by any process and names the call at which all of them stop, so all of them save the
        same step (a save is collective). It is called once per `maybe_save` on every process (a monotonic
        counter, not the step, which goes back on a rollback)."""
        if self.stop_requested:
            return
        if not self._multi_process:
            self.stop_requested = self._signal_received
            return
        self._sync_calls += 1
        if multihost_utils.reached_preemption_sync_point(self._sync_calls):
            self.stop_requested, self.stop_signal = True, "SIGTERM"
        del step

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    # ---- restore ---------------------------------------------------------------------------------------
    def _meta(self, train_iter) -> dict:
        mesh = jax.tree.leaves(self._shardings)[0].mesh if self._shardings is not None else None
        return {
            "data": train_iter.get_state() if train_iter is not None else None,
            "seed": int(self.config.train.seed),
            "config": json.loads(self.config.to_json_best_effort()),
            "kernels": kernels.resolve(self.config.model).as_dict(),  # what `auto` resolved to (docs/kernels.md)
            "mesh": {k: int(v) for k, v in mesh.shape.items()} if mesh is not None else None,
            "process_count": jax.process_count(),
            "rollbacks": {str(k): v for k, v in self._rollbacks.items()},
        }

    def restore_or_keep(self, state: Any, shardings: Any, train_iter: Any = None, codec: Any = None) -> Any:
        """The newest readable committed checkpoint restored onto `shardings`' mesh, else `state` unchanged.

        codec: how the run's state maps to what checkpoints hold (`zaya_jax.train.setup.Training`: its
        `checkpoint_target`, `to_checkpoint`, `from_checkpoint`); None = the state itself is saved.
        """
        self._shardings = shardings
        if codec is not None:
            self._encode, self._decode, self._target = (
                codec.to_checkpoint,
                codec.from_checkpoint,
                codec.checkpoint_target,
            )
        else:
            self._target = abstract_target(state, shardings)
        self.heartbeat.beat(int(state.step), "start")
        self.ckpt._check_space(tree_nbytes(self._target))
        self.events.write(
            "start",
            checkpoint_dir=self.ckpt.directory,
            devices=jax.device_count(),
            mesh={k: int(v) for k, v in jax.tree.leaves(shardings)[0].mesh.shape.items()},
            committed=self.ckpt.committed_steps(),
        )
        if not self.config.checkpoint.restore:
            return state
        had = self.ckpt.committed_steps()
        found = self._restore_newest()
        if found is not None:
            restored, meta, step = found
            self._restore_data(step, meta, train_iter)
            self._last_saved = step
            self._rollbacks.update({int(k): int(v) for k, v in (meta.get("rollbacks") or {}).items()})
            self.events.write(
                "restored", step=step, saved_mesh=meta.get("mesh"), mesh=self._meta(None)["mesh"], data=meta.get("data")
            )
            if self._resume_changes:
                logging.getLogger(__name__).warning(
                    "resuming step %d with a changed config: %s", step, describe(self._resume_changes)
                )
                self.events.write(
                    "config_changed",
                    step=step,
                    changes={k: {"saved": old, "now": new} for k, (old, new) in self._resume_changes.items()},
                )
            self.heartbeat.beat(step, "start")
            return restored
        if had:
            raise CheckpointError(
                f"no readable checkpoint left in {self.ckpt.directory} (unreadable steps moved "
                f"to {self.ckpt.directory}.corrupt); rerun to start from step 0"
            )
        self.events.write("fresh_start", step=int(state.step))
        if self.config.checkpoint.save_initial:  # the untrained model, e.g. as an evaluation baseline
            self._save(int(state.step), state, train_iter)
        return state

    def _restore_newest(self) -> tuple[Any, dict, int] | None:
        """(state, meta, step) of the newest committed step that reads back intact; damaged newer steps are
        quarantined (moved to `<dir>.corrupt/`, nothing deleted) and reported. None if no step is readable."""
        for step in reversed(self.ckpt.committed_steps()):
            try:
                meta = self.ckpt.read_meta(step)
                current = json.loads(self.config.to_json_best_effort())
                self._resume_changes = config_changes(meta.get("config"), current)
                check_resumable(self._resume_changes, self.ckpt._where(step))  # one line; not a corruption
                restored, meta = self.ckpt.restore(step, self._target)
            except CorruptCheckpointError as err:
                dest = self.ckpt.quarantine(step)
                older = [s for s in self.ckpt.committed_steps() if s < step]
                then = f"falling back to step {older[-1]}" if older else "no older checkpoint"
                logging.getLogger(__name__).warning("%s; moved it to %s, %s", err, dest, then)
                self.events.write("checkpoint_corrupt", step=step, error=str(err), moved_to=dest)
                continue
            return self._decode(restored), meta, step
        return None

    def _restore_data(self, step: int, meta: dict, train_iter: Any) -> None:
        if train_iter is None or meta.get("data") is None:
            return
        try:
            train_iter.set_state(meta["data"])
        except ValueError as err:
            raise CheckpointConfigError(
                f"checkpoint step {step} in {self.ckpt.directory}: data iterator: {err}"
            ) from err

    # ---- per step --------------------------------------------------------------------------------------
    def maybe_save(self, step: int, state: Any, train_iter: Any = None, metrics: dict | None = None) -> Any:
        """Guard, save every `checkpoint.every` steps, inject faults, handle preemption. Returns the state."""
        self.resume_step = None
        state, metrics = self._metric_faults(step, state, metrics)
        save_now = bool(self.every and step % self.every == 0)
        bad = self._check(step, metrics, blocking=save_now or step >= int(self.config.train.steps))
        if bad is not None:
            return self._rollback(bad[0], bad[1], step, train_iter)
        if save_now:
            self._save(step, state, train_iter)
        self.faults.process_faults(step)
        self._agree_on_stop(step)
        if self.stop_requested:
            todo, self._pending = ([self._pending] if self._pending is not None else []), None
            bad = self._run_checks(todo)
            if bad is not None:  # never save a bad state, even when preempted
                return self._rollback(bad[0], bad[1], step, train_iter)
            self._save(step, state, train_iter, wait=True)
            self.ckpt.wait()
            self.events.write("preempted", step=step, signal=self.stop_signal)
        return state

    def _metric_faults(self, step: int, state: Any, metrics: dict | None):
        if fault := self.faults.due("nan", step):
            self.faults.record(fault, step)
            leaves, treedef = jax.tree.flatten(state.params)
            leaves[0] = leaves[0] * jnp.nan  # one poisoned tensor is enough to poison the next forward
            state = state._replace(params=jax.tree.unflatten(treedef, leaves))
            metrics = dict(metrics or {}, loss=float("nan"))
        if fault := self.faults.due("spike", step):
            self.faults.record(fault, step)
            metrics = dict(metrics or {}, loss=float(metrics["loss"]) * 100.0)
        return state, metrics

    def _check(self, step: int, metrics: dict | None, *, blocking: bool) -> tuple[int, str] | None:
        """(bad step, reason) for the first flagged pending/current metrics, else None."""
        if not self.guard.enabled or metrics is None:
            return None
        todo = [self._pending] if self._pending is not None else []
        self._pending = None
        if blocking:
            todo.append((step, metrics))
        else:
            self._pending = (step, metrics)
        return self._run_checks(todo)

    def _run_checks(self, todo: list[tuple[int, Any]]) -> tuple[int, str] | None:
        for s, m in todo:
            grad_norm = float(m["grad_norm"]) if "grad_norm" in m else None
            reason = self.guard.check(s, float(m["loss"]), grad_norm)
            if reason is not None:
                self._pending = None
                return s, reason
        return None

    def _rollback(self, bad_step: int, reason: str, step: int, train_iter: Any) -> Any:
        self.ckpt.wait()  # an in-flight save passed the guard: let it commit and count as good
        found = self._restore_newest()
        if found is None:
            raise CheckpointConfigError(
                f"step {bad_step}: {reason}, and there is no readable checkpoint in "
                f"{self.ckpt.directory} to roll back to; lower the learning rate or save "
                "earlier (checkpoint.every)"
            )
        restored, _, target = found
        self._rollbacks[target] += 1
        if self._rollbacks[target] > self.max_rollbacks:
            raise CheckpointConfigError(
                f"step {bad_step}: {reason}; already rolled back to step {target} "
                f"{self.max_rollbacks} times (checkpoint.max_rollbacks), giving up"
            )
        self.guard.rewind(target)
        data = train_iter.get_state() if train_iter is not None else None
        self.events.write(
            "rollback",
            bad_step=bad_step,
            reason=reason,
            to_step=target,
            skipped_steps=[target + 1, step],
            data=data,
            count=self._rollbacks[target],
        )
        self.resume_step = target
        self._last_saved = target
        return restored

    def _save(self, step: int, state: Any, train_iter: Any, *, wait: bool = False) -> None:
        if self._last_saved == step:
            return
        with self._write_section():  # a second SIGINT is acted on once the save is handed over and logged
            info = self.ckpt.save(step, self._encode(state), self._meta(train_iter), wait=wait)
            self._last_saved = step
            self.events.write("save", **info)
        if fault := self.faults.due("sigkill_during_save", step):
            in_flight = step not in self.ckpt.committed_steps()
            self.faults.kill_now(fault, step, in_flight=in_flight)
        if fault := self.faults.due("corrupt_checkpoint", step):
            self.ckpt.wait()
            damaged = faults_lib.corrupt_step_dir(self.ckpt.step_dir(step), fault.arg or "truncate")
            self.faults.record(fault, step, files=len(damaged))
            raise faults_lib.InjectedFault(f"injected corruption of checkpoint step {step}")

    def abort(self) -> None:
        """The run is failing (exception / KeyboardInterrupt): let an in-flight save of a good state commit."""
        try:
            with self._write_section(interruptible=False):
                self.ckpt.wait()
        except CheckpointError as err:
            self.events.write("abort_save_failed", error=str(err))
        finally:
            self._restore_signal_handlers()
            self.lock.release()
        self.events.write("abort", last_save=self.ckpt.last_save)

    def save_now(self, step: int, state: Any, train_iter: Any = None, *, wait: bool = True) -> None:
        """On-demand save (e.g. from a hook or an interactive session)."""
        self._save(step, state, train_iter, wait=wait)

    # ---- end -------------------------------------------------------------------------------------------
    def finish(self, step: int, state: Any, train_iter: Any = None) -> None:
        """Save the final step (if not saved yet), wait for commits, apply retention, close."""
        try:
            with self._write_section():
                if step > 0 and self._last_saved != step:
                    self._save(step, state, train_iter)
                self.ckpt.close()
        finally:
            self._restore_signal_handlers()
            self.lock.release()
        phase = "preempted" if self.stop_requested else "done"
        self.heartbeat.beat(step, phase)
        self.events.write("finish", step=step, phase=phase, last_save=self.ckpt.last_save)


def make_checkpointer(config: ml_collections.ConfigDict, workdir: str, **kwargs) -> TrainCheckpointer:
    """The loop's checkpointer for `config.checkpoint`."""
    return TrainCheckpointer(config, workdir, **kwargs)
