"""Print ZAYA1 parameter counts from the model's abstract init (no weights allocated).

python -m launch.count_params --config=experiments/zaya1_base.py
"""

from absl import flags
from ml_collections import config_flags

from launch import cli
from zaya_jax.config import validate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    from zaya_jax.model.params import param_counts

    config = validate(_CONFIG.value)
    for name, value in param_counts(config.model).items():
        print(f"{name:>22}: {value:>16,}")


if __name__ == "__main__":
    cli.run(main, "count_params")
