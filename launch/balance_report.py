"""Expert-balancing report (per-layer load CV / dropped fraction, heat maps) from finished training runs.

    python -m launch.balance_report --runs=old=runs/demo_old,new=runs/demo --out=benchmarks/balancing/demo

Writes `<label>.csv` (step, layer, load_cv, dropped, ...), `<label>_expert_load.png`, `load_cv.png`,
`dropped.png` (one panel per layer, one line per run) and `summary.json` (means over the last `--last`
steps, the balance verdict and the eval loss) under `--out`, and prints the summary and one verdict line per run:
the same window (last 50 steps by default) and threshold as the trainer's progress bar and summary
(`zaya_jax.train.health.window_balance`).
"""

import json

from absl import flags

from launch import cli

_RUNS = flags.DEFINE_list("runs", None, "label=workdir pairs of finished training runs.")
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_LAST = flags.DEFINE_integer("last", 50, "Average over the logged steps of this many final steps.", lower_bound=1)
_TITLE = flags.DEFINE_string("title", "", "Plot title.")
flags.mark_flags_as_required(["runs", "out"])


def main(argv):
    del argv
    from zaya_jax.bench.balancing import report

    runs = {}
    for item in _RUNS.value:
        label, sep, workdir = item.partition("=")
        if not sep or not label or not workdir:
            cli.fail("balance_report", f"--runs entry {item!r} is not label=workdir, e.g. --runs=old=runs/a,new=runs/b")
        runs[label] = workdir
    if _OUT.value:
        cli.check_out_dir("balance_report", _OUT.value, "the report")
    try:
        summary = report(runs, _OUT.value, last=_LAST.value, title=_TITLE.value)
    except (OSError, ValueError) as err:
        cli.fail("balance_report", str(err))
    from zaya_jax.train import health

    print(json.dumps(summary, indent=2))
    for label, run in summary.items():
        print(f"{label}: {health.balance_verdict(run)}")


if __name__ == "__main__":
    cli.run(main, "balance_report", jax_flags=False)
