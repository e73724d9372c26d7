#!/usr/bin/env bash
# One node of a multi-node run: environment, then the trainer under its own supervisor.
#
#   launch/rocm/node.sh CONFIG WORKDIR [extra launch.train flags ...]
#
# Started once per node by launch/rocm/train.sbatch (`srun --ntasks-per-node=1`). The trainer process calls
# jax.distributed.initialize from the srun environment (SLURM_PROCID / SLURM_NTASKS / SLURM_STEP_NODELIST;
# coordinator = first node, port derived from the job id) and drives the node's 8 GPUs.
#
# Shared (WORKDIR on a filesystem every node sees): metrics.jsonl, tensorboard/, checkpoints/, xla_cache/.
# Per node (WORKDIR/nodes/<SLURM_NODEID>/): the supervisor's heartbeat.json and events.jsonl, so that each
# supervisor watches its own trainer (process 0 also logs trainer events to WORKDIR/nodes/0/events.jsonl).
#
# Knobs (environment): ZAYA_VENV (activate this venv), ZAYA_MAX_RESTARTS (default 3),
# ZAYA_HEARTBEAT_TIMEOUT (s, default 900), ZAYA_STARTUP_TIMEOUT (s, default 3600), ZAYA_CHECKPOINT_DIR
# (default WORKDIR/checkpoints), ZAYA_DRY_RUN=1 (print the command instead of running it).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 CONFIG WORKDIR [extra launch.train flags ...]" >&2
  exit 2
fi
config=$1
workdir=$2
shift 2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=launch/rocm/env.sh
source "$here/env.sh"
if [[ -n "${ZAYA_VENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$ZAYA_VENV/bin/activate"
fi

node=${SLURM_NODEID:-0}
node_dir="$workdir/nodes/$node"
checkpoint_dir=${ZAYA_CHECKPOINT_DIR:-$workdir/checkpoints}
# Compiled programs survive restarts (an 8B step compiles for minutes) [I].
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$workdir/xla_cache}

cmd=(python -m launch.supervise
  --workdir="$node_dir"
  --checkpoint_dir="$checkpoint_dir"
  --max_restarts="${ZAYA_MAX_RESTARTS:-3}"
  --heartbeat_timeout="${ZAYA_HEARTBEAT_TIMEOUT:-900}"
  --startup_timeout="${ZAYA_STARTUP_TIMEOUT:-3600}"
  --
  python -m launch.train
  --config="$config"
  --workdir="$workdir"
  --config.checkpoint.dir="$checkpoint_dir"
  --cpu_devices=0
  "$@")

if [[ "${ZAYA_DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi

mkdir -p "$node_dir"
if [[ "$node" == 0 ]]; then  # what this run used, for the record
  env | grep -E '^(NCCL|RCCL|HSA|HIP|GPU_MAX|XLA|JAX|SLURM_JOB|SLURM_NNODES)' | sort > "$workdir/env.txt"
fi
cd "$repo"
exec "${cmd[@]}"
