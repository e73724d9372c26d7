"""Pretrain ZAYA1.

    python -m launch.train --config=experiments/zaya1_tiny.py --config.train.steps=300 --workdir=runs/tiny

Any config field can be overridden with `--config.<field>=<value>`. Multi-process runs call
`jax.distributed.initialize`: pass `--coordinator_address=host:port --num_processes=N --process_id=i`,
or nothing under SLURM (jax reads the SLURM environment). On a CPU-only host, `--cpu_devices=N`
(default 8) emulates N devices so meshes such as 2 data × 4 expert run anywhere. Compiled programs are
cached in `<workdir>/xla_cache` (`train.compilation_cache_dir`).

Before any work the layout is checked (`zaya_jax.train.schedule.check_layout`) and the workdir is locked.
Errors are one line (`--verbose` for the traceback); exit status 78 means bad input (see `launch/cli.py`).
"""

from launch.cpu_devices import prepare_host

prepare_host()

import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402
from zaya_jax.checkpoint import elastic  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (experiments/*.py).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics, TensorBoard events and checkpoints.")
cpu_devices.define_flag(8)
_COORD = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs).")
_NPROC = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process runs).")
_PID = flags.DEFINE_integer("process_id", None, "This process's index (multi-process runs).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    None,
    "Force jax.distributed.initialize (default: when --coordinator_address is given or SLURM_NTASKS > 1).",
)
_PROFILE_STEPS = flags.DEFINE_list(
    "profile_steps",
    None,
    "START,STOP: write a jax.profiler trace of optimizer steps [START, STOP) (START >= 1; a single N traces step N).",
)
_PROFILE_DIR = flags.DEFINE_string("profile_dir", None, "Directory for the profiler trace (default <workdir>/profile).")
flags.mark_flags_as_required(["config", "workdir"])
flags.register_validator("workdir", lambda v: v is None or bool(v.strip()), "--workdir must not be empty")
flags.register_validator(
    "profile_steps",
    lambda v: v is None or (0 < len(v) <= 2 and all(s.isdigit() for s in v)),
    "--profile_steps takes START,STOP or a single step N (non-negative integers)",
)


def _profile_hook(workdir: str):
    """A `ProfileHook` from --profile_steps / --profile_dir, or None."""
    if not _PROFILE_STEPS.value:
        return None
    from zaya_jax.train.profiling import ProfileHook

    steps = [int(v) for v in _PROFILE_STEPS.value]
    start, stop = (steps[0], steps[0] + 1) if len(steps) == 1 else steps
    return ProfileHook(_PROFILE_DIR.value or os.path.join(workdir, "profile"), start, stop)


def _maybe_initialize_distributed() -> None:
    import jax

    wanted = _DISTRIBUTED.value
    if wanted is None:
        wanted = bool(_COORD.value) or int(os.environ.get("SLURM_NTASKS", "1")) > 1
    if not wanted:
        return
    if _COORD.value and (_NPROC.value is None or _PID.value is None):
        cli.fail("train", "--coordinator_address needs --num_processes and --process_id")
    try:
        jax.distributed.initialize(coordinator_address=_COORD.value, num_processes=_NPROC.value, process_id=_PID.value)
    except ValueError as err:  # e.g. SLURM_NTASKS > 1 outside `srun`: no SLURM_STEP_* variables to detect
        cli.fail(
            "train",
            f"jax.distributed.initialize: {err}. Start one process per node with srun "
            "(launch/rocm/train.sbatch) or pass --coordinator_address/--num_processes/--process_id",
        )
    logging.info(
        "process %d of %d, %d global devices (%d local)",
        jax.process_index(),
        jax.process_count(),
        jax.device_count(),
        jax.local_device_count(),
    )
    # jax's SLURM detection assumes one process per GPU and pins this process to GPU $SLURM_LOCALID unless
    # JAX_LOCAL_DEVICE_IDS is set; with one process per node that silently drops 7 of 8 GPUs.
    gpus = os.environ.get("SLURM_GPUS_ON_NODE", "")
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE", "1")
    if gpus.isdigit() and tasks.isdigit() and jax.local_device_count() * int(tasks) < int(gpus):
        logging.warning(
            "this process sees %d device(s) but the node has %s GPUs for %s task(s): set "
            "JAX_LOCAL_DEVICE_IDS=0,1,...,7 (launch/rocm/env.sh)",
            jax.local_device_count(),
            gpus,
            tasks,
        )


def _elastic_shrink(config):
    """Elastic restart ($ZAYA_AVAILABLE_DEVICES=n): a copy of `config` (validated again) with a mesh of at most n
    devices the batch still splits over; `config` itself when the variable is unset."""
    if (n := elastic.available_devices()) is None:
        return config
    from zaya_jax.config import validate

    config = config.copy_and_resolve_references()
    sizes = elastic.shrink_mesh(config, n)
    used = sizes["data"] * sizes["expert"] * sizes["context"]
    if used < n:  # before jax starts its backend
        elastic.use_devices(used)
        logging.warning("elastic: %d devices available, but the global batch only splits over %d of them", n, used)
    logging.info("elastic: mesh %s", sizes)
    return validate(config)


def main(argv):
    del argv
    from zaya_jax.config import ConfigError, validate

    try:
        elastic.apply_to_environment()  # $ZAYA_AVAILABLE_DEVICES (set by launch.supervise) overrides --cpu_devices
    except ValueError as err:
        raise ConfigError(str(err)) from None
    config = _elastic_shrink(validate(_CONFIG.value))
    _maybe_initialize_distributed()
    import jax

    from zaya_jax.checkpoint import make_checkpointer
    from zaya_jax.parallel.mesh import resolve_mesh_shape
    from zaya_jax.planning import sizing
    from zaya_jax.train.health import balance_verdict
    from zaya_jax.train.loop import train
    from zaya_jax.train.schedule import check_layout

    check_layout(config, resolve_mesh_shape(config.mesh, jax.device_count()), process_count=jax.process_count())
    sizing.warn_model(config.model)  # "sizing: ..." warnings for a model the MI300X-aware rules flag (docs/sizing.md)
    workdir = os.path.abspath(_WORKDIR.value)
    checkpointer = make_checkpointer(config, workdir)
    profiler = _profile_hook(workdir)
    try:
        summary = train(
            config,
            workdir,
            checkpointer=checkpointer,
            hooks=[checkpointer.heartbeat] + ([profiler] if profiler else []),
        )
    except BaseException as err:
        checkpointer.abort()  # a crash still lets an in-flight save of a good state commit
        if checkpointer.interrupted or cli.interrupted():  # Ctrl-C twice: whatever it interrupted, not a crash
            committed = checkpointer.ckpt.committed_steps()
            raise KeyboardInterrupt(
                f"newest committed checkpoint: step {committed[-1]}" if committed else "no checkpoint committed"
            ) from None
        if checkpointer.ckpt.save_failed:  # don't wait minutes at exit for Orbax's threads of the failed save
            cli.fail_now("train", err)
        raise
    finally:
        if profiler:
            profiler.close()
    if jax.process_index() == 0:
        summary.pop("state", None)
        print(
            json.dumps(
                {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in summary.items()},
                indent=2,
                allow_nan=False,
            )
        )  # valid JSON: a loss never logged is null
        if "eval_loss" in summary and "unigram_entropy" in summary:
            print(
                f"held-out loss {summary['eval_loss']:.3f} nats/token vs unigram entropy "
                f"{summary['unigram_entropy']:.3f} (a model of token frequencies alone)"
            )
        if verdict := balance_verdict(summary.get("balance")):
            print(verdict)


if __name__ == "__main__":
    cli.run(main, "train")
