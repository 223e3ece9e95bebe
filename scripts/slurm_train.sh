#!/usr/bin/env bash
# Multi-node training under Slurm: one launcher (kenotron train, torchrun inside) per node,
# rendezvous on the first node (docs/multi-node.md).
#   sbatch --nodes 4 --gpus-per-node 8 scripts/slurm_train.sh --config llama3_8b
# Extra arguments go to the trainer (`--config`, `--section.key value` overrides). The job's exit
# code is the failing rank's (2 for a config error); each node keeps its ranks' output under
# <job.dump_folder>/logs/.
#SBATCH --job-name=kenotron
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RDZV_PORT=${RDZV_PORT:-29500}

srun --kill-on-bad-exit=1 python -m kenotron.cli train \
  --nnodes "$SLURM_JOB_NUM_NODES" --nproc "$GPUS_PER_NODE" \
  --rdzv-endpoint "$HEAD_NODE:$RDZV_PORT" --rdzv-id "$SLURM_JOB_ID" \
  "$@"
