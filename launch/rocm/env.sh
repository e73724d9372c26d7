# shellcheck shell=bash
# ROCm / RCCL / XLA environment for zaya_jax on AMD MI300X nodes (8 GPUs, 8 Pollara 400 NICs, rails-only).
#
# Sourced by launch/rocm/node.sh on every node before Python starts. Every variable keeps a value that is
# already set (`${VAR:-default}`), so a site profile or the sbatch environment overrides it.
#
# Tags (as in the paper spec): [P]/[Z] stated by the paper / Zyphra, [B] public vendor docs or AMD's own
# launch scripts (AMD-AGI/Primus, ROCm/MAD), not the paper; [I] inferred for this cluster; [site] must
# be checked on the actual machines (`ibv_devices`, `ip -br addr`, `rocm-smi --showtopo`).
# The paper trained with PyTorch on ROCm 6.4 [S]; these values target JAX on ROCm 7 and are not yet
# validated on hardware (launch/rocm/README.md).

# ----------------------------------------------------------------------------------------- devices
# GPUs per node: 8 × MI300X [Z].
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# One JAX process drives all 8 GPUs of its node. jax's SLURM auto-detection otherwise assumes one process per
# GPU and pins the process to GPU $SLURM_LOCALID (= 0), silently dropping 7 of 8 GPUs. jax reads this variable
# in jax.distributed.initialize; launch/train.py warns if a process still sees fewer GPUs than SLURM allotted.
export JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-$(seq -s, 0 $((GPUS_PER_NODE - 1)))}
# HIP_VISIBLE_DEVICES is left unset on purpose: SLURM's GPU binding (ROCR_VISIBLE_DEVICES) or all GPUs apply,
# and launch.supervise sets it to the first N GPUs after a device loss (single-node runs only, see README).
# export HIP_VISIBLE_DEVICES=0,1,2,3,4,5,6,7

# --------------------------------------------------------------------------------------- JAX / XLA
# Fraction of HBM the XLA client preallocates; AMD's MI300X MaxText recipes use .97 to avoid HSA out-of-memory
# errors in multi-node runs [B]. 192 GB per GPU [B].
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-.97}
# XLA flags [B]: one per line, with why, in zaya_jax/planning/gpu_targets/rocm.xla_flags (launch/xla_flags.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../xla_flags.sh" && zaya_export_xla_flags rocm || return 1
# Quiet C++ logs (benign shutdown messages) [B].
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

# --------------------------------------------------------------------------------------- HIP / HSA
# Two hardware queues per device: more only adds contention for XLA's streams [B].
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
# Kernel arguments in device memory (lower launch latency) [B].
export HIP_FORCE_DEV_KERNARG=${HIP_FORCE_DEV_KERNARG:-1}
# Fine-grained host memory over PCIe for peer / NIC access [B].
export HSA_FORCE_FINE_GRAIN_PCIE=${HSA_FORCE_FINE_GRAIN_PCIE:-1}
# gfx942 (MI300X): do not reclaim scratch memory; AMD sets it for MI300X MoE stability [B].
export HSA_NO_SCRATCH_RECLAIM=${HSA_NO_SCRATCH_RECLAIM:-1}
# HIP >= 7.17 ignores stream priorities by default, which puts XLA's collective stream on the compute queue
# and removes compute/communication overlap; 0 restores priorities (no effect on older HIP) [B].
export DEBUG_HIP_IGNORE_STREAM_PRIORITY=${DEBUG_HIP_IGNORE_STREAM_PRIORITY:-0}

# ---------------------------------------------------------- RCCL over Pollara 400 (RoCEv2, rails-only)
# XLA on ROCm runs cross-process GPU collectives with RCCL, which reads the NCCL_* names.
# Log level: WARN in production; INFO (plus NCCL_DEBUG_SUBSYS=INIT,NET) to see the rings and NICs chosen.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# RDMA devices: the 8 Pollara NICs, one per GPU [Z]; the `ionic_N` names come from the Pollara (ionic) driver
# as seen in public AINIC deployments [B][site].
export NCCL_IB_HCA=${NCCL_IB_HCA:-ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7}
# RoCEv2 GID index; 1 in AMD's AINIC profile [B][site] (`show_gids` lists the RoCEv2 entry). Unset = auto.
export NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-1}
# Bootstrap / out-of-band TCP interface: the frontend network, separate from the compute fabric [S]. [site]
# e.g. export NCCL_SOCKET_IFNAME=enp81s0f1np1  (unset = RCCL picks the first non-loopback interface)
# Rails-only topology [Z]: GPU k talks to GPU k of other nodes through NIC k / rail switch k; crossing rails
# is done over xGMI inside a node, so never pair different NIC indices across nodes [I].
export NCCL_CROSS_NIC=${NCCL_CROSS_NIC:-0}
# PXN (move data over xGMI to the GPU whose NIC sits on the target rail before sending) is what lets traffic
# between different rails avoid the spine in a rails-only fabric [I]; AMD's generic scripts disable it by
# default to save memory [B]. Benchmark both with `python -m launch.bench` (all-gather / reduce-scatter).
export NCCL_PXN_DISABLE=${NCCL_PXN_DISABLE:-0}
# AMD AINIC network plugin (ANP) for Pollara, when installed (AMD's AINIC profile) [B][site]:
#   export NCCL_NET_PLUGIN=librccl-anp.so  LD_LIBRARY_PATH=/opt/amd-anp/build:$LD_LIBRARY_PATH
if [[ -z "${NCCL_NET_PLUGIN:-}" && -n "${ANP_HOME_DIR:-}" && -f "${ANP_HOME_DIR}/build/librccl-anp.so" ]]; then
  export NCCL_NET_PLUGIN=librccl-anp.so
  export LD_LIBRARY_PATH="${ANP_HOME_DIR}/build${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi
# AINIC profile values from AMD's scripts [B] (one queue pair per connection, inline sends, no GDR flush,
# no dma-buf registration, RCCL's own CPU affinity instead of the process mask):
export NCCL_IB_QPS_PER_CONNECTION=${NCCL_IB_QPS_PER_CONNECTION:-1}
export NCCL_IB_USE_INLINE=${NCCL_IB_USE_INLINE:-1}
export NCCL_GDR_FLUSH_DISABLE=${NCCL_GDR_FLUSH_DISABLE:-1}
export RCCL_GDR_FLUSH_GPU_MEM_NO_RELAXED_ORDERING=${RCCL_GDR_FLUSH_GPU_MEM_NO_RELAXED_ORDERING:-0}
export NCCL_DMABUF_ENABLE=${NCCL_DMABUF_ENABLE:-0}
export NCCL_IGNORE_CPU_AFFINITY=${NCCL_IGNORE_CPU_AFFINITY:-1}
# Traffic classes of the lossless RDMA queue (data / control); they must match the switch QoS policy, and
# public AINIC setups use different values (41/185, 104/192) [site]. Unset = driver default.
# export NCCL_IB_TC=104 NCCL_IB_FIFO_TC=192
# MSCCL / MSCCL++ algorithm overrides off (stability, AMD default) [B].
export RCCL_MSCCL_ENABLE=${RCCL_MSCCL_ENABLE:-0}
export RCCL_MSCCLPP_ENABLE=${RCCL_MSCCLPP_ENABLE:-0}
