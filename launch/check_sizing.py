"""Check a config against the MI300X-aware sizing rules (docs/sizing.md).

    python -m launch.check_sizing --config=experiments/zaya1_base.py [--hardware=mi300x]
        [--tokens_per_device=16384] [--mesh=data:8,expert:2] [--strict] [--config.model.head_dim=96]

Prints the violations and the proposed nearest compliant sizes. Exit status 0 whether or not rules are
violated; 78 (one line, `launch/cli.py`) when the config cannot be loaded or a flag is wrong.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from launch import cli
from zaya_jax import hardware
from zaya_jax.config import GEOMETRY_FIELDS, ConfigError, validate
from zaya_jax.parallel.mesh import parse_mesh_spec
from zaya_jax.planning import sizing

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (experiments/*.py[:arg]).", lock_config=True
)
flags.DEFINE_string("hardware", "mi300x", "target accelerator (zaya_jax.hardware.HARDWARE key)")
flags.DEFINE_integer("tokens_per_device", None, "tokens per device per microbatch (enables token rules)", lower_bound=1)
flags.DEFINE_string("mesh", None, "mesh sizes, e.g. data:8,expert:2 (default: the config's mesh, axes > 1)")
flags.DEFINE_bool("strict", False, "also flag dims that are multiples of 64 but not of 128")
flags.mark_flags_as_required(["config"])

MODEL_FIELDS = GEOMETRY_FIELDS


def main(argv: list[str]) -> None:
    del argv
    try:
        hw = hardware.get_hardware(FLAGS.hardware)
    except ValueError as err:
        raise ConfigError(f"--hardware: {err}") from None
    mesh = {k: v for k, v in parse_mesh_spec(FLAGS.mesh).items() if v > 1} if FLAGS.mesh else None
    config = validate(_CONFIG.value)

    model = config.model
    print(f"config:   {config_flags.get_config_filename(FLAGS['config'])}")
    print(f"hardware: {hw.describe()}")
    print("model:    " + " ".join(f"{f}={model[f]}" for f in MODEL_FIELDS if f in model))
    kwargs = dict(tokens_per_device=FLAGS.tokens_per_device, mesh=mesh, strict=FLAGS.strict)
    violations = sizing.check_model(config, hw, **kwargs)
    if violations:
        print(f"{len(violations)} sizing violation(s):")
        for v in violations:
            print(f"  - {v}")
        proposals = sizing.propose(config, hw, **kwargs)
        if proposals:
            print("proposed nearest compliant sizes:")
            for field, value in proposals.items():
                current = model[field] if field in model else FLAGS.tokens_per_device
                print(f"  {field}: {current} -> {value}")
    else:
        print("no sizing violations")
    print(f"note:     {sizing.ridge_requirement(model, hw)}")


if __name__ == "__main__":
    cli.run(main, "check_sizing")
