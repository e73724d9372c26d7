"""Where the time of the CPU train step goes: XLA op time per step, grouped by op and by kind.

Profiles the peer comparisons' step (`python -m benchmarks.peers`; same config semantics: AdamW, no balancing,
1 CPU device) with `jax.profiler` and sums the trace's op durations over a few steps:

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/tools/profile_step.py float32 experiments/zaya1_100m.py

(launchers set the huge-page tunable themselves; this script does not re-exec, so set it as above). Prints
the step times, the top ops with the jax op that produced each, and a table by kind (`dot/ynn` = GEMMs;
`copy` = layout copies; `dynamic-slice` / `dynamic-update-slice` = the layer scan's slicing and stacking;
`broadcast` = zero-fills). Ops nest (a `while` contains its body), so kinds overlap a little.
"""

import collections
import glob
import gzip
import json
import os
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
from step_times import warmed_trainer  # noqa: E402  (this folder: scripts run from it)

from zaya_jax.train.microbatch import BATCH_KEYS  # noqa: E402

STEPS = 3


def kind(op: str) -> str:
    if "dot" in op or "ynn" in op:
        return "dot/ynn"
    return re.sub(r"[\.\d]+$", "", op).split("_")[0]


def main(dtype: str = "float32", config_path: str = "experiments/zaya1_100m.py", out: str = "/tmp/profile_step"):
    trainer, batches = warmed_trainer(dtype, config_path, STEPS)
    with jax.profiler.trace(out, create_perfetto_trace=True):
        seconds = [trainer.timed_step(b)[1] for b in batches[2:]]
    batch = trainer.batch(batches[0])
    hlo = trainer.step_fn.jitted.lower(trainer.state, {k: batch[k] for k in BATCH_KEYS}).compile().as_text()
    origin = dict(re.findall(r'^\s*(?:ROOT )?%(\S+) = .*?op_name="([^"]*)"', hlo, flags=re.M))
    trace = sorted(glob.glob(os.path.join(out, "**", "*.json.gz"), recursive=True))[-1]
    per_op, calls = collections.Counter(), collections.Counter()
    for e in json.load(gzip.open(trace))["traceEvents"]:
        name = e.get("name", "")
        if e.get("ph") == "X" and "dur" in e and not name.startswith(("Thunk", "$", "Slinky", "Pjit", "np.")):
            per_op[name] += e["dur"] / 1e3 / STEPS
            calls[name] += 1
    print(f"steps (s): {', '.join(f'{s:.3f}' for s in seconds)}")
    print(f"{'ms/step':>8} {'calls':>6}  op  (jax op)")
    for name, ms in per_op.most_common(40):
        print(f"{ms:8.1f} {calls[name] // STEPS:6d}  {name}  ({origin.get(name, '')[-90:]})")
    by_kind = collections.Counter()
    for name, ms in per_op.items():
        by_kind[kind(name)] += ms
    print("by kind (ms/step): " + ", ".join(f"{k} {v:.0f}" for k, v in by_kind.most_common(12)))


if __name__ == "__main__":
    main(*sys.argv[1:])
