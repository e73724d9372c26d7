"""`Checkpointer`: the project's wrapper around Orbax's `CheckpointManager`.

One checkpoint = `<dir>/<step>/` with two Orbax items:
    state   the TrainState pytree (step, params, opt_state, biases, balancing), PyTree handler
    meta    JSON: format version, step, data-iterator state, seed, config, mesh, save time, and the
            checksum manifest of the state's arrays (`integrity`), sealed with its own SHA-256

Commit protocol: Orbax writes into `<step>.orbax-checkpoint-tmp*` and renames (or writes
`commit_success.txt` where renames are not atomic); only finalized step directories count as
committed. A writable `Checkpointer` has Orbax remove leftovers of interrupted saves when it opens the
directory (`cleanup_tmp_directories`; the trainer holds the workdir lock by then) and logs their names.
Retention (keep the newest `keep` committed steps plus every multiple of `keep_every`) is Orbax's
preservation policy (`LatestN` ∪ `EveryNSteps`), applied by Orbax after a new save has committed, so the
previous good checkpoint is never deleted before the new one commits. Restores build their target from the
*current* mesh (ShapeDtypeStructs with
NamedShardings), so any mesh works. Every restore is checked against the checksums: a missing,
truncated or bit-rotted file raises `CorruptCheckpointError` (the trainer quarantines the step and falls
back to the previous one); a config that builds a different tree raises `CheckpointConfigError`.

`save` and `restore` are the only places the state is handed to / received from Orbax.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp
from orbax.checkpoint.path import step as ocp_step

from zaya_jax.checkpoint import integrity
from zaya_jax.checkpoint.errors import CheckpointConfigError, CheckpointError, CorruptCheckpointError
from zaya_jax.checkpoint.events import EventLog
from zaya_jax.checkpoint.quiet import first_line, quiet_orbax
from zaya_jax.keys import path_name

STATE, META = "state", "meta"
FORMAT_VERSION = 2  # 2: the metadata digest is mandatory (integrity.check_seal)
READABLE_FORMATS = (1, 2)  # 1: the digest may be missing (written before it existed)
SEALED_SINCE = 2
TMP_MARKER = ".orbax-checkpoint-tmp"


def abstract_target(tree: Any, shardings: Any, dtype_fn=None) -> Any:
    """ShapeDtypeStructs (with the given shardings) for every array leaf of `tree`."""

    def leaf(x, s):
        dtype = dtype_fn(x) if dtype_fn else x.dtype
        return jax.ShapeDtypeStruct(x.shape, dtype, sharding=s)

    return jax.tree.map(leaf, tree, shardings)


def tree_nbytes(tree: Any) -> int:
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _check_writable(directory: str) -> None:
    probe = directory
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    if not os.path.isdir(probe):
        raise CheckpointConfigError(f"checkpoint directory {directory}: {probe} exists and is not a directory")
    read_only_fs = bool(os.statvfs(probe).f_flag & getattr(os, "ST_RDONLY", 1))
    if read_only_fs or not os.access(probe, os.W_OK | os.X_OK):
        raise CheckpointConfigError(
            f"checkpoint directory {directory} is not writable ({probe} is read-only); "
            "pass a writable --workdir or checkpoint.dir"
        )


def retention_policy(keep: int, keep_every: int):
    """Orbax preservation policy: the newest `keep` checkpoints plus every step that is a multiple of `keep_every`
    (0 = none)."""
    policies = [pp.LatestN(n=keep)] + ([pp.EveryNSteps(interval_steps=keep_every)] if keep_every > 0 else [])
    return pp.AnyPreservationPolicy(policies)


class Checkpointer:
    """Save / restore / retain train-state checkpoints in one directory (see module docstring)."""

    def __init__(
        self,
        directory: str,
        *,
        keep: int = 3,
        keep_every: int = 0,
        async_save: bool = True,
        read_only: bool = False,
        events: EventLog | None = None,
    ):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.keep, self.keep_every, self.read_only = max(int(keep), 1), int(keep_every), read_only
        self.events = events or EventLog(None, "checkpoint")
        quiet_orbax()
        if read_only:
            if not os.path.isdir(self.directory):
                raise CheckpointConfigError(f"checkpoint directory {self.directory} does not exist")
        else:
            _check_writable(self.directory)
            os.makedirs(self.directory, exist_ok=True)
        leftovers = [] if read_only else self.uncommitted()
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=async_save and not read_only,
            read_only=read_only,
            create=not read_only,
            save_interval_steps=0 if read_only else 1,
            cleanup_tmp_directories=not read_only,
            preservation_policy=None if read_only else retention_policy(self.keep, self.keep_every),
            async_options=ocp.AsyncOptions(post_finalization_callback=self._written)
            if async_save and not read_only
            else None,
        )
        self._written_at: float | None = None  # when Orbax finished writing the in-flight save
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={STATE: ocp.PyTreeCheckpointHandler(), META: ocp.JsonCheckpointHandler()},
        )
        self._in_flight: tuple[int, float, int] | None = None  # (step, start time, bytes)
        # a write failed (e.g. a full disk): Orbax's other writer threads of that save then wait minutes for
        # signals that never come, and a process exiting normally waits for them (launch.train exits at once)
        self.save_failed = False
        for name in leftovers:
            self.events.write("cleanup_uncommitted", path=os.path.join(self.directory, name))
        self.last_save: dict | None = None

    # ---- discovery -------------------------------------------------------------------------------------
    def committed_steps(self) -> list[int]:
        """Finalized (committed) steps on disk, ascending."""
        return sorted(ocp_step.checkpoint_steps(self.directory))

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def uncommitted(self) -> list[str]:
        """Leftovers of interrupted saves: Orbax tmp dirs and step dirs without a commit."""
        if not os.path.isdir(self.directory):
            return []
        committed = {str(s) for s in self.committed_steps()}
        return sorted(
            name
            for name in os.listdir(self.directory)
            if os.path.isdir(os.path.join(self.directory, name))
            and (TMP_MARKER in name or (name.isdigit() and name not in committed))
        )

    # ---- saving ----------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, meta: dict, *, wait: bool = False) -> dict:
        """Save `state` + `meta` as step `step` (async unless `wait`); returns {'step', 'bytes', 'blocking_s'}."""
        if self.read_only:
            raise CheckpointError(f"checkpoint directory {self.directory} was opened read-only")
        self.wait()  # previous save committed (or its error raised) before anything is written
        if step in self.committed_steps():
            raise CheckpointConfigError(
                f"checkpoint step {step} already exists in {self.directory}; refusing to "
                "overwrite it (use a new checkpoint.dir)"
            )
        nbytes = tree_nbytes(state)
        self._check_space(nbytes)
        meta = integrity.seal(
            dict(
                meta,
                format_version=FORMAT_VERSION,
                step=int(step),
                saved_at=time.time(),
                arrays=integrity.manifest(state),
            )
        )
        start, self._written_at = time.perf_counter(), None
        try:
            self.manager.save(
                int(step),
                force=True,
                args=ocp.args.Composite(**{STATE: ocp.args.PyTreeSave(state), META: ocp.args.JsonSave(meta)}),
            )
        except Exception as err:  # noqa: BLE001 - report any I/O failure as one line
            self.save_failed = True
            raise CheckpointError(self._save_failed(step, err)) from err
        blocking = time.perf_counter() - start
        self._in_flight = (int(step), start, nbytes)
        info = {"step": int(step), "bytes": nbytes, "blocking_s": round(blocking, 4)}
        if wait:
            info.update(self.wait() or {})
        return info

    def _check_space(self, nbytes: int) -> None:
        free = shutil.disk_usage(self.directory).free
        need = nbytes // max(jax.process_count(), 1) + (1 << 20)
        if free < need:
            raise CheckpointError(
                f"not enough free space in {self.directory} for a checkpoint: need about "
                f"{need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB free"
            )

    def wait(self) -> dict | None:
        """Block until an in-flight save commits; returns its {'step', 'total_s', 'bytes'} (None if none)."""
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as err:  # noqa: BLE001
            step = self._in_flight[0] if self._in_flight else "?"
            self._in_flight = None
            self.save_failed = True
            raise CheckpointError(self._save_failed(step, err)) from err
        if self._in_flight is None:
            return None
        step, start, nbytes = self._in_flight
        self._in_flight = None
        if step not in self.committed_steps():
            raise CheckpointError(f"checkpoint step {step} in {self.directory} did not commit")
        total = (self._written_at or time.perf_counter()) - start  # the write, not the wait for it
        self.last_save = {
            "step": step,
            "total_s": round(total, 4),
            "bytes": nbytes,
            "MiB_per_s": round(nbytes / 2**20 / max(total, 1e-9), 2),
        }
        self.events.write("commit", **self.last_save)
        return self.last_save

    def _save_failed(self, step, err: BaseException) -> str:
        """The one-line report of a failed save (a full disk named as such, without TensorStore's spec dumps)."""
        text = f"{type(err).__name__}: {err}"
        if isinstance(err, OSError) and err.errno == errno.ENOSPC or "No space left on device" in text:
            return (
                f"saving checkpoint step {step} to {self.directory} failed: No space left on device; "
                "earlier checkpoints are kept: free space there (or set checkpoint.dir) and rerun to resume"
            )
        return f"saving checkpoint step {step} to {self.directory} failed: {first_line(err)}"

    def _written(self) -> None:
        """Orbax's post-finalization callback (its save thread): the in-flight save is on disk."""
        self._written_at = time.perf_counter()

    @property
    def saving(self) -> bool:
        return self._in_flight is not None

    # ---- restoring -------------------------------------------------------------------------------------
    def _where(self, step: int) -> str:
        return f"checkpoint step {step} in {self.directory}"

    def read_meta(self, step: int) -> dict:
        """The step's metadata; CorruptCheckpointError if it is missing, unreadable or fails its checksum."""
        try:
            restored = self.manager.restore(int(step), args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
            meta = restored[META]
        except Exception as err:  # noqa: BLE001
            raise CorruptCheckpointError(f"{self._where(step)} is unreadable: metadata ({first_line(err)})") from err
        if not isinstance(meta, dict):
            raise CorruptCheckpointError(f"{self._where(step)} is unreadable: its metadata is not a JSON object")
        version = meta.get("format_version")
        if integrity.DIGEST_KEY not in meta and version not in READABLE_FORMATS:
            raise CheckpointConfigError(
                f"{self._where(step)} has no zaya_jax metadata (format_version {FORMAT_VERSION} expected)"
            )
        # a digest is required from SEALED_SINCE on: stripping it (an edited file) is corruption, not an old format
        sealed = not (isinstance(version, int) and version < SEALED_SINCE)
        integrity.check_seal(meta, self._where(step), required=sealed)
        if version not in READABLE_FORMATS:
            raise CheckpointConfigError(
                f"{self._where(step)} has zaya_jax format_version {version!r}; this version reads "
                f"{list(READABLE_FORMATS)} (a newer zaya_jax wrote it?)"
            )
        return meta

    def saved_shapes(self, step: int, meta: dict | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        """{'params/embed': (shape, dtype), ...} of the saved state, from the checksum manifest in `meta` (read
        if not given) or, for checkpoints written before checksums, from Orbax's metadata."""
        meta = self.read_meta(step) if meta is None else meta
        if isinstance(meta.get("arrays"), dict):
            return {name: (tuple(entry[0]), str(entry[1])) for name, entry in meta["arrays"].items()}
        try:
            tree = self.manager.item_metadata(int(step))[STATE]
            tree = getattr(tree, "tree", tree)
            flat = [(p, m) for p, m in jax.tree_util.tree_flatten_with_path(tree)[0] if m is not None]
        except Exception as err:  # noqa: BLE001
            raise CorruptCheckpointError(
                f"{self._where(step)} is unreadable: state metadata ({first_line(err)})"
            ) from err
        if not flat:
            raise CorruptCheckpointError(f"{self._where(step)} is unreadable: its state metadata is missing")
        return {path_name(p): (tuple(getattr(m, "shape", ()) or ()), str(getattr(m, "dtype", ""))) for p, m in flat}

    def check_target(self, step: int, target: Any, *, partial: bool = False, meta: dict | None = None) -> None:
        """Raise a one-line CheckpointConfigError if `target`'s leaves do not match the saved ones (shape /
        presence): the config builds a different model or optimizer than the one saved."""
        saved = self.saved_shapes(step, meta)
        wanted = {path_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
        for name, shape in wanted.items():
            if name not in saved:
                raise CheckpointConfigError(
                    f"{self._where(step)} has no {name!r} (the config builds a different "
                    "model/optimizer than the one saved)"
                )
            if tuple(saved[name][0]) != shape:
                raise CheckpointConfigError(
                    f"{self._where(step)}: {name!r} has shape {list(saved[name][0])} but the "
                    f"config gives {list(shape)}; restore with the config saved in the "
                    "checkpoint (meta) or start a new checkpoint.dir"
                )
        extra = sorted(set(saved) - set(wanted)) if not partial else []
        if extra:
            raise CheckpointConfigError(
                f"{self._where(step)} has {len(extra)} entries the config does not build "
                f"(e.g. {extra[0]!r}); the model or optimizer differs"
            )

    def restore(self, step: int, target: Any, *, partial: bool = False) -> tuple[Any, dict]:
        """(state, meta) of `step`, restored into `target` (ShapeDtypeStructs with shardings; dtypes cast).

        Arrays are read in their saved dtype, checked against their checksums, then cast. Raises
        CheckpointConfigError if `target` does not match the saved tree, CorruptCheckpointError if the step
        cannot be read or fails a checksum.
        """
        meta = self.read_meta(step)
        self.check_target(step, target, partial=partial, meta=meta)
        saved = meta.get("arrays") if isinstance(meta.get("arrays"), dict) else None
        read_as = target
        if saved is not None:
            read_as = jax.tree_util.tree_map_with_path(
                lambda p, t: jax.ShapeDtypeStruct(t.shape, saved[path_name(p)][1], sharding=t.sharding), target
            )
        try:
            restore_args = ocp.checkpoint_utils.construct_restore_args(read_as)
            restored = self.manager.restore(
                int(step),
                args=ocp.args.Composite(
                    **{STATE: ocp.args.PyTreeRestore(item=read_as, restore_args=restore_args, partial_restore=partial)}
                ),
            )[STATE]
        except Exception as err:  # noqa: BLE001
            raise CorruptCheckpointError(f"{self._where(step)} is unreadable: {first_line(err)}") from err
        if saved is not None:
            integrity.verify(restored, saved, self._where(step))
            restored = jax.tree.map(lambda x, t: x if x.dtype == t.dtype else x.astype(t.dtype), restored, target)
        return restored, meta

    def quarantine(self, step: int) -> str:
        """Move an unreadable committed step out of the checkpoint directory (nothing is deleted)."""
        dest_root = self.directory.rstrip("/") + ".corrupt"
        os.makedirs(dest_root, exist_ok=True)
        dest = os.path.join(dest_root, f"step-{step}-{int(time.time() * 1000)}")
        if jax.process_index() == 0:
            shutil.move(self.step_dir(step), dest)
        self.manager.reload()
        return dest

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.manager.close()
