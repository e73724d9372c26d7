"""Times of the peer comparisons' step (`python -m benchmarks.peers`; AdamW, 1 CPU device) in this process, with
the kernel's share.

For before/after comparisons of a change: run it from each source tree in turn, each run a fresh process,
alternating, on a quiet host:

    for r in 1 2; do for tree in /path/to/before /path/to/after; do
      (cd $tree && GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/tools/step_times.py bfloat16)
    done; done

Prints one line per timed step (seconds, minor page faults, system and user CPU seconds) and a summary line
with the min and median. System time is the kernel faulting in (and zeroing) the step's fresh temporary
buffers: on some VMs it varies from step to step with the same number of faults.
"""

import os
import resource
import statistics
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.peers.train import JaxTrainer, bench_config  # noqa: E402
from zaya_jax.bench.inputs import make_batches  # noqa: E402
from zaya_jax.config import load_config  # noqa: E402


def warmed_trainer(dtype: str, config_path: str, steps: int) -> tuple[JaxTrainer, list]:
    """The bench step's trainer, compiled and warmed up on two batches, and steps + 2 batches (the first two
    used for the warm-up)."""
    cfg = bench_config(load_config(config_path), dtype=None if dtype == "float32" else dtype)
    trainer = JaxTrainer(cfg)
    batches = make_batches(cfg.model.vocab_size, cfg.train.global_batch_size, cfg.train.seq_len, steps + 2)
    for b in batches[:2]:
        trainer.timed_step(b)
    return trainer, batches


def main(dtype: str = "float32", config_path: str = "experiments/zaya1_100m.py", steps: str = "6") -> None:
    trainer, batches = warmed_trainer(dtype, config_path, int(steps))
    times = []
    for b in batches[2:]:
        before = resource.getrusage(resource.RUSAGE_SELF)
        times.append(trainer.timed_step(b)[1])
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"step {times[-1]:.3f} s  faults {after.ru_minflt - before.ru_minflt}  "
            f"sys {after.ru_stime - before.ru_stime:.2f} s  user {after.ru_utime - before.ru_utime:.2f} s"
        )
    print(f"{dtype}: min {min(times):.3f} s, median {statistics.median(times):.3f} s over {len(times)} steps")


if __name__ == "__main__":
    main(*sys.argv[1:])
