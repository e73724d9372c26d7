"""Compile a train step for one GPU target in a process of its own (used by `launch.gpu_check --compile` and
`launch.plan --target`; `zaya_jax.planning.gpu_compile`).

The child starts with the target platform's XLA flags in $XLA_FLAGS (`gpu_target.xla_flags`, the flags
launch/<platform>/env.sh sets for a real run) and JAX_PLATFORMS=cpu, so that an abort inside XLA's GPU compiler
ends only the child: the parent reports it as that target's failure (its last fatal line) and goes on with the
next target.

    python -m launch.gpu_compile_job SPEC.json OUT_DIR    # SPEC: {"target", "config" (a dict), "nodes", "gpus",
                                                          #        "extra_flags"}

writes OUT_DIR/<target>.json (`GpuCompileResult.as_dict()` plus its `line`) and OUT_DIR/<target>.hlo.txt.
`run_in_child` gives the child a temporary folder and keeps only <target>.hlo.txt, in the caller's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import ml_collections


def run_in_child(
    config: ml_collections.ConfigDict,
    target,
    nodes: int,
    gpus: int,
    hlo_dir: str | None = None,
    extra_flags: tuple[str, ...] = (),
) -> dict:
    """Compile `config` for `target` (`gpu_target.GpuTarget`) on nodes × gpus in a child process (XLA flags: the
    platform's, then `extra_flags`); its result dict, or a failed one with the child's last fatal line. The
    scheduled HLO goes to `hlo_dir`/<target>.hlo.txt when given; nothing else is left behind."""
    from zaya_jax.planning import gpu_target

    extra_flags = tuple(extra_flags)
    env = dict(os.environ, XLA_FLAGS=gpu_target.env_xla_flags(target.platform, extra_flags), JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"gpu_compile_{target.name}_") as work:
        spec = os.path.join(work, "spec.json")
        with open(spec, "w", encoding="utf-8") as f:
            spec_dict = dict(target=target.name, config=config.to_dict(), nodes=nodes, gpus=gpus)
            json.dump(spec_dict | dict(extra_flags=list(extra_flags)), f, default=list)
        done = subprocess.run(
            [sys.executable, "-m", "launch.gpu_compile_job", spec, work], env=env, capture_output=True, text=True
        )
        path = os.path.join(work, f"{target.name}.json")
        if done.returncode == 0 and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                result = json.load(f)
            if hlo_dir:
                name = f"{target.name}.hlo.txt"
                shutil.move(os.path.join(work, name), os.path.join(hlo_dir, name))
            return result
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
    from zaya_jax.config import ConfigError
    from zaya_jax.planning import gpu_compile

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    config = ml_collections.ConfigDict(spec["config"])
    try:
        result = gpu_compile.compile_step(
            config,
            spec["target"],
            nodes=spec["nodes"],
            gpus_per_node=spec["gpus"],
            extra_flags=tuple(spec.get("extra_flags", ())),
        )
    except ConfigError as err:
        print(f"gpu_compile_job: fatal: {err}", file=sys.stderr)
        sys.exit(78)
    with open(os.path.join(out_dir, f"{spec['target']}.hlo.txt"), "w", encoding="utf-8") as f:
        f.write(result.hlo_text)
    with open(os.path.join(out_dir, f"{spec['target']}.json"), "w", encoding="utf-8") as f:
        json.dump(result.as_dict() | {"line": result.line()}, f, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:3])
