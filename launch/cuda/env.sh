# shellcheck shell=bash
# CUDA / NCCL / XLA environment for zaya_jax on NVIDIA H100 / H200 nodes (8 GPUs per node).
#
# Source it before Python starts (`source launch/cuda/env.sh; python -m launch.train ...`). Every variable keeps
# a value that is already set (`${VAR:-default}`), so a site profile or the job environment overrides it.
# XLA aborts at start-up on a flag its version does not know: tests/integration/test_rocm_launch.py checks every flag here
# against the installed jaxlib. Tags: [B] public NVIDIA JAX-Toolbox MaxText recipes (docs/frameworks/maxtext,
# docs/GPU_performance.md); [I] inferred for this model. Not yet validated on hardware (`launch.gpu_check`
# measures it; benchmarks/gpu/).

# GPUs per node; one JAX process drives all of them (see launch/rocm/env.sh for why).
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
export JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-$(seq -s, 0 $((GPUS_PER_NODE - 1)))}
# Fraction of HBM the XLA client preallocates [B].
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-.90}
# One hardware work queue on Hopper, so that a collective launched first also starts first [B].
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

# XLA flags [B]: one per line, with why, in zaya_jax/planning/gpu_targets/cuda.xla_flags (launch/xla_flags.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../xla_flags.sh" && zaya_export_xla_flags cuda || return 1
# jax >= 0.12 on several nodes: add --xla_gpu_experimental_use_collective_kernels= (NCCL for every collective) to
# XLA_FLAGS; XLA 0.12 aborts compiling its Triton kernel for the step's scalar all-reduce at 8 x 8 H100, and
# XLA 0.10.2 does not know the flag (docs/planner.md, "The data:64 H100 abort").
# Quiet C++ logs [B].
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# NCCL: warnings only; INFO (plus NCCL_DEBUG_SUBSYS=INIT,NET) shows the rings and NICs chosen.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
