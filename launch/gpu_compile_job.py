"""Compile a train step for one GPU target in a process of its own (used by `launch.gpu_check --compile` and
`launch.plan --target`; `zaya_jax.planning.gpu_compile`).

The child starts with the target platform's XLA flags in $XLA_FLAGS (launch/<platform>/env.sh, as a real run gets
them) and JAX_PLATFORMS=cpu, so that an abort inside XLA's GPU compiler ends only the child: the parent reports it
as that target's failure (its last fatal line) and goes on with the next target.

    python -m launch.gpu_compile_job SPEC.json OUT_DIR    # SPEC: {"target", "config" (a dict), "nodes", "gpus"}

writes OUT_DIR/<target>.json (`GpuCompileResult.as_dict()` plus its `line`) and OUT_DIR/<target>.hlo.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import ml_collections


def run_in_child(
    config: ml_collections.ConfigDict, target, nodes: int, gpus: int, work: str, extra_flags: tuple[str, ...] = ()
) -> dict:
    """Compile `config` for `target` (`gpu_target.GpuTarget`) on nodes × gpus in a child process (XLA flags: the
    platform's, then `extra_flags`); its result dict, or a failed one with the child's last fatal line."""
    from zaya_jax.planning import gpu_target

    spec = os.path.join(work, f"{target.name}.spec.json")
    with open(spec, "w", encoding="utf-8") as f:
        json.dump(dict(target=target.name, config=config.to_dict(), nodes=nodes, gpus=gpus), f, default=list)
    env = dict(os.environ, XLA_FLAGS=gpu_target.env_xla_flags(target.platform, tuple(extra_flags)), JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "launch.gpu_compile_job", spec, work], env=env, capture_output=True, text=True
    )
    os.remove(spec)
    path = os.path.join(work, f"{target.name}.json")
    if done.returncode == 0 and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    cause = next((ln for ln in lines if "Fatal" in ln or "fatal" in ln), lines[-1] if lines else "")
    error = f"the compile process ended with exit code {done.returncode}: {cause[:300]}"
    line = f"compiled for {target.name}: FAILED ({error}; {time.perf_counter() - t0:.1f} s)"
    return dict(
        target=target.name,
        platform=target.platform,
        topology=f"{nodes}x{gpus}",
        mesh=dict(config.mesh),
        ok=False,
        fits=False,
        error=error,
        line=line,
    )


def main(spec_path: str, out_dir: str) -> None:
    from zaya_jax.planning import gpu_compile

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    config = ml_collections.ConfigDict(spec["config"])
    result = gpu_compile.compile_step(config, spec["target"], nodes=spec["nodes"], gpus_per_node=spec["gpus"])
    with open(os.path.join(out_dir, f"{spec['target']}.hlo.txt"), "w", encoding="utf-8") as f:
        f.write(result.hlo_text)
    with open(os.path.join(out_dir, f"{spec['target']}.json"), "w", encoding="utf-8") as f:
        json.dump(result.as_dict() | {"line": result.line()}, f, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:3])
