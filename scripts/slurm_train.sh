#!/usr/bin/env bash
# Multi-node training under Slurm: one torchrun per node, rendezvous on the first node.
#   sbatch --nodes 4 --gpus-per-node 8 scripts/slurm_train.sh --config train_configs/llama3_8b.toml
# Extra arguments are passed to the trainer (`--section.key value` overrides).
#SBATCH --job-name=kenotron
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RDZV_PORT=${RDZV_PORT:-29500}

srun --kill-on-bad-exit=1 torchrun \
  --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node "$GPUS_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:$RDZV_PORT" --rdzv-id "$SLURM_JOB_ID" \
  --local-ranks-filter 0 --role rank --tee 3 \
  -m kenotron.train "$@"
