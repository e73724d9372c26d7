"""Offline checkpoint conversion: new mesh / parallel layout, dtype casting, Hugging Face export and import.

    # reshard (e.g. 2 data x 4 expert -> 4 data x 2 expert, ZeRO-1 -> FSDP), cast params to bf16
    python -m launch.reshard --src=runs/x/checkpoints --dst=/tmp/ck_4x2 --mesh=data:4,expert:2 \\
        --param_sharding=fsdp --dtype=bfloat16
    # export the model (params + balancing biases) as a transformers checkpoint, with its tokenizer and
    # generation config (AutoTokenizer / AutoModelForCausalLM load the folder alone)
    python -m launch.reshard --src=runs/x/checkpoints --to_hf=/tmp/hf_out [--hf_layout=legacy]
    # import a transformers checkpoint as step 0 of a training run (fresh optimizer state)
    python -m launch.reshard --from_hf=/tmp/hf_out --dst=runs/y/checkpoints --config=experiments/zaya1_tiny.py

`--src` is a checkpoint directory, a step directory or a training workdir (newest committed step unless
`--step`). On a CPU-only host the emulated device count defaults to the product of `--mesh` (else 8;
`--cpu_devices=N` overrides). Nothing existing is overwritten: `--dst` / `--to_hf` must be new or empty, and
`--dst` is locked while it is written. A target mesh the run could not train on (e.g. a global batch that
does not split over it) is refused before anything is read (`zaya_jax.train.schedule.check_layout`).
"""

from launch.cpu_devices import prepare_host

prepare_host()

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import warnings  # noqa: E402

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import cli, cpu_devices  # noqa: E402
from zaya_jax.config import GEOMETRY_FIELDS, PARAM_SHARDINGS  # noqa: E402
from zaya_jax.parallel.mesh import parse_mesh_spec  # noqa: E402

_SRC = flags.DEFINE_string("src", None, "Source checkpoint (directory, step directory or workdir).")
_DST = flags.DEFINE_string("dst", None, "Output checkpoint directory (new or empty).")
_STEP = flags.DEFINE_integer("step", None, "Step to convert (default: newest committed).")
_MESH = flags.DEFINE_string("mesh", None, "Target mesh, e.g. data:4,expert:2 (unnamed axes = 1; -1 fills).")
_SHARDING = flags.DEFINE_enum("param_sharding", None, list(PARAM_SHARDINGS), "Target parameter layout.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Cast parameters (and optimizer state) to this.")
_TO_HF = flags.DEFINE_string("to_hf", None, "Export the model to this Hugging Face directory.")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer",
    None,
    "--to_hf: tokenizer to write next to the model ('byte' or a tokenizer.json; default: the one the run used)",
)
_HF_LAYOUT = flags.DEFINE_enum("hf_layout", "hf", ["hf", "legacy"], "Tensor names of the export.")
_FROM_HF = flags.DEFINE_string("from_hf", None, "Import this Hugging Face directory as step 0 into --dst.")
cli.require_numbers("step", minimum=0)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config for --from_hf (default: defaults + the HF model).", lock_config=True
)
cpu_devices.define_flag(
    None, "Emulated CPU devices (default: the --mesh product, else 8; wins over XLA_FLAGS' device count when given)."
)

GEOMETRY = (
    *GEOMETRY_FIELDS,
    "cca_time0",
    "cca_time1",
    "partial_rotary_factor",
)


def _fresh_dir(path: str, flag: str) -> str:
    from zaya_jax.checkpoint import CheckpointConfigError
    from zaya_jax.checkpoint.lock import LOCK_NAME

    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and (not os.path.isdir(path) or set(os.listdir(path)) - {LOCK_NAME}):
        raise CheckpointConfigError(
            f"{flag}={path} exists and is not empty; nothing was written (choose a new directory)"
        )
    return path


@contextlib.contextmanager
def _locked_dst(path: str):
    """`--dst`, new or empty, locked against a concurrent trainer / reshard while the block writes it. If the block
    fails, the lock file goes again (unless it was there before) and so does `--dst` if this created it and it is
    empty: a failed command leaves the user's folders as they were."""
    from zaya_jax.checkpoint import DirLock
    from zaya_jax.checkpoint.lock import LOCK_NAME

    dst = _fresh_dir(path, "--dst")
    created, lock_file = not os.path.exists(dst), os.path.join(dst, LOCK_NAME)
    had_lock = os.path.exists(lock_file)
    lock = DirLock({"--dst": dst}, "reshard")
    try:
        lock.acquire(wait_s=0)
        _fresh_dir(dst, "--dst")  # still empty now that it is ours
        yield dst
    except BaseException:
        lock.release()
        with contextlib.suppress(OSError):
            if not had_lock:
                os.remove(lock_file)
            if created:
                os.rmdir(dst)  # only when empty
        raise
    lock.release()


def _target_mesh(config):
    """The mesh for `config.mesh` on this process's devices, after checking that the run can use it."""
    import jax

    from zaya_jax.parallel.mesh import make_mesh, resolve_mesh_shape
    from zaya_jax.train.schedule import check_layout

    check_layout(config, resolve_mesh_shape(config.mesh, jax.device_count()))
    return make_mesh(config)


def _bar(total: int, desc: str, unit: str = "B"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024, dynamic_ncols=True)


def _saved_field_bytes(shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, int]:
    """{TrainState field: bytes on disk} from `Checkpointer.saved_shapes` ({'params/embed': (shape, dtype)})."""
    import math

    import jax.numpy as jnp

    out: dict[str, int] = {}
    for path, (shape, dtype) in shapes.items():
        field = path.split("/", 1)[0]
        out[field] = out.get(field, 0) + math.prod(shape) * jnp.dtype(dtype).itemsize
    return out


def reshard(
    src: str, dst: str, *, step: int | None, mesh_spec: str | None, param_sharding: str | None, dtype: str | None
) -> dict:
    """Restore `src` onto the target mesh/layout/dtype and save it to `dst` (same step, meta carried over)."""
    from zaya_jax.checkpoint import Checkpointer, load_train_state
    from zaya_jax.checkpoint.manager import tree_nbytes
    from zaya_jax.checkpoint.model_io import open_checkpoint

    _fresh_dir(dst, "--dst")  # before anything is read
    ck, step, meta, config = open_checkpoint(src, step)
    field_bytes = _saved_field_bytes(ck.saved_shapes(step, meta))
    ck.close()
    if mesh_spec:
        config.mesh.update(parse_mesh_spec(mesh_spec))
    else:
        config.mesh.data = -1
    if param_sharding:
        config.train.param_sharding = param_sharding
    if dtype:
        config.model.param_dtype = dtype
    mesh = _target_mesh(config)
    import jax

    with _locked_dst(dst) as dst:
        bar = _bar(sum(field_bytes.values()), f"restore step {step}")  # bytes on disk, field by field

        def progress(name: str, nbytes: int) -> None:
            bar.set_postfix_str(name)
            bar.update(field_bytes.get(name, 0))

        config, step, meta, _, state, _ = load_train_state(src, mesh, config=config, step=step, progress=progress)
        bar.close()
        out = Checkpointer(dst, async_save=False)
        meta = dict(
            meta,
            config=json.loads(config.to_json_best_effort()),
            mesh={k: int(v) for k, v in mesh.shape.items()},
            resharded_from=os.path.abspath(src),
        )
        with _bar(tree_nbytes(state), f"write {dst}") as wbar:
            info = out.save(step, state, meta, wait=True)
            wbar.update(tree_nbytes(state))
        out.close()
    return {
        "dst": dst,
        "step": step,
        "mesh": meta["mesh"],
        "param_sharding": config.train.param_sharding,
        "param_dtype": config.model.param_dtype,
        "bytes": info["bytes"],
        "devices": jax.device_count(),
    }


def export_hf(src: str, out: str, *, step: int | None, dtype: str | None, layout: str) -> dict:
    """Write the checkpoint's model as a transformers directory (config.json + safetensors)."""
    from zaya_jax import hf
    from zaya_jax.checkpoint import load_model
    from zaya_jax.hf.tokenizer_files import normalize_permissions, run_tokenizer, save_tokenizer_files

    out = _fresh_dir(out, "--to_hf")
    with _bar(2, "export", "stage") as bar:
        config, model = load_model(src, step=step, dtype=dtype)
        bar.update(1)
        if layout == "hf" and (message := _skip_slot_warning(src, step, config.model.skip_output)):
            warnings.warn(message, stacklevel=2)
        hf.save_pretrained(model, out, layout=layout)
        spec = _TOKENIZER.value or run_tokenizer(config.data)
        if spec is None:
            warnings.warn(
                "the run's prepared data used a tokenizer.json this export cannot find: no tokenizer was "
                "written (pass --tokenizer=/path/tokenizer.json)",
                stacklevel=2,
            )
        else:
            save_tokenizer_files(out, spec, config.model)
        normalize_permissions(out)
        bar.update(1)
    return {"to_hf": out, "layout": layout, "param_dtype": config.model.param_dtype, "tokenizer": spec}


def _skip_slot_warning(src: str, step: int | None, skip_output: str) -> str | None:
    """The skip-slot warning of an HF-layout export, from the run's logged skip use (zaya_jax.hf.skip_usage)."""
    from zaya_jax.checkpoint import resolve_checkpoint
    from zaya_jax.hf.skip_usage import logged_skip_use, skip_slot_warning

    if skip_output == "zero":
        return None
    directory, step = resolve_checkpoint(src, step)
    use = logged_skip_use(os.path.join(os.path.dirname(directory), "metrics.jsonl"), step)
    return skip_slot_warning(skip_output, use)


def import_hf(path: str, dst: str, *, config=None, mesh_spec: str | None, dtype: str | None) -> dict:
    """Step-0 training checkpoint from a transformers directory (fresh optimizer, balancing and data state)."""
    from zaya_jax import hf
    from zaya_jax.checkpoint import CheckpointConfigError, Checkpointer
    from zaya_jax.config import default_config
    from zaya_jax.train.optimizer import make_optimizer
    from zaya_jax.train.state import create_train_state

    dst = _fresh_dir(dst, "--dst")  # checked before the import reads anything; locked only to write it
    config = config if config is not None else default_config()
    if dtype:
        config.model.param_dtype = dtype
    with _bar(3, "import", "stage") as bar:
        hf_config, model = hf.load_pretrained(
            os.path.expanduser(path), dtype=config.model.param_dtype, skip_output=config.model.skip_output
        )
        if _CONFIG.value is not None:
            for name in GEOMETRY:
                if hf_config.model[name] != config.model[name]:
                    raise CheckpointConfigError(
                        f"--from_hf={path}: {name}={hf_config.model[name]} but the --config "
                        f"has model.{name}={config.model[name]}; use a matching config"
                    )
        else:
            config.model = hf_config.model
        bar.update(1)
        if mesh_spec:
            config.mesh.update(parse_mesh_spec(mesh_spec))
        mesh = _target_mesh(config)
        _, state, _ = create_train_state(config, mesh, make_optimizer(config), model=model)
        bar.update(1)
        meta = {
            "data": None,
            "seed": int(config.train.seed),
            "config": json.loads(config.to_json_best_effort()),
            "mesh": {k: int(v) for k, v in mesh.shape.items()},
            "process_count": 1,
            "imported_from": os.path.abspath(path),
        }
        with _locked_dst(dst) as dst:
            out = Checkpointer(dst, async_save=False)
            info = out.save(0, state, meta, wait=True)
            out.close()
        bar.update(1)
    return {"dst": dst, "step": 0, "mesh": meta["mesh"], "bytes": info["bytes"]}


def _default_devices() -> None:
    """Without --cpu_devices: as many emulated devices as --mesh uses (else 8), unless the environment sets a count."""
    if flags.FLAGS.cpu_devices is not None:
        return
    sizes = parse_mesh_spec(_MESH.value) if _MESH.value else {}
    product = 1
    for size in sizes.values():
        product *= size
    cpu_devices.emulate(product if sizes and min(sizes.values()) > 0 else 8, explicit=False)


def main(argv) -> None:
    del argv
    from zaya_jax.config import validate

    _default_devices()
    src, dst, to_hf, from_hf = _SRC.value, _DST.value, _TO_HF.value, _FROM_HF.value
    if from_hf:
        if src or to_hf or not dst:
            cli.fail("reshard", "--from_hf needs --dst (and neither --src nor --to_hf)")
        config = validate(_CONFIG.value) if _CONFIG.value is not None else None
        result = import_hf(from_hf, dst, config=config, mesh_spec=_MESH.value, dtype=_DTYPE.value)
    elif src and to_hf:
        if dst:
            cli.fail("reshard", "pass either --dst (reshard) or --to_hf (export), not both")
        result = export_hf(src, to_hf, step=_STEP.value, dtype=_DTYPE.value, layout=_HF_LAYOUT.value)
    elif src and dst:
        result = reshard(
            src, dst, step=_STEP.value, mesh_spec=_MESH.value, param_sharding=_SHARDING.value, dtype=_DTYPE.value
        )
    else:
        cli.fail("reshard", "pass --src with --dst (reshard) or --to_hf (export), or --from_hf with --dst")
    print(json.dumps(result))


if __name__ == "__main__":
    cli.run(main, "reshard")
