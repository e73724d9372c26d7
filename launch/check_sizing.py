"""Check a config against the MI300X-aware sizing rules (docs/sizing.md).

    python -m launch.check_sizing --config=experiments/zaya1_base.py [--hardware=mi300x]
        [--tokens_per_device=16384] [--mesh=data=8,expert=2] [--strict]

Prints the violations and the proposed nearest compliant sizes. Exit code 0 whether or not rules
are violated; 1 only when the config file cannot be loaded (missing, broken, invalid).
"""

from __future__ import annotations

import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "config file exposing get_config(arg); 'path.py:arg' passes arg")
flags.DEFINE_string("hardware", "mi300x", "target accelerator (zaya_jax.sizing.HARDWARE key)")
flags.DEFINE_integer("tokens_per_device", None, "tokens per device per microbatch (enables token rules)")
flags.DEFINE_list("mesh", None, "mesh axis sizes, e.g. data=8,expert=2 (default: the config's mesh, "
                                "axes > 1)")
flags.DEFINE_bool("strict", False, "also flag dims that are multiples of 64 but not of 128")

MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_q_heads", "num_kv_heads", "head_dim",
                "num_experts", "moe_intermediate_size", "router_hidden_size")


def _parse_mesh(items: list[str] | None) -> dict[str, int] | None:
    if not items:
        return None
    mesh = {}
    for item in items:
        name, _, size = item.partition("=")
        if not size.strip().isdigit():
            raise app.UsageError(f"--mesh item {item!r}: expected axis=size")
        mesh[name.strip()] = int(size)
    return mesh


def main(argv: list[str]) -> int:
    del argv
    from zaya_jax import sizing
    from zaya_jax.config import load_config

    if not FLAGS.config:
        raise app.UsageError("--config is required, e.g. --config=experiments/zaya1_base.py")
    try:
        hw = sizing.get_hardware(FLAGS.hardware)
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    mesh = _parse_mesh(FLAGS.mesh)
    try:
        config = load_config(FLAGS.config)
    except Exception as e:  # noqa: BLE001 - any failure to load makes the file unusable
        print(f"error: cannot use config {FLAGS.config!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    model = config.model if "model" in config else config
    print(f"config:   {FLAGS.config}")
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
    return 0


if __name__ == "__main__":
    app.run(main)
