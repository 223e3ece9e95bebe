#!/usr/bin/env bash
# Train with kenotron through torchrun.
#   ./run_train.sh                                   # debug model, built-in corpus, 1 process on CPU
#   CONFIG_FILE=train_configs/llama3_8b.toml ./run_train.sh --training.steps 20
#   NPROC=4 ./run_train.sh --parallelism.dp_shard 2 --parallelism.tp 2
# NPROC defaults to the number of visible GPUs, or 1 without GPUs. Multi-node: set NNODES,
# NODE_RANK and RDZV_ENDPOINT (host:port of node 0), or use scripts/slurm_train.sh.
set -euo pipefail
cd "$(dirname "$0")"

CONFIG_FILE=${CONFIG_FILE:-train_configs/debug.toml}
if [[ -z "${NPROC:-}" ]]; then
  NPROC=$(python -c "import torch; print(max(torch.cuda.device_count(), 1))" 2>/dev/null || echo 1)
fi
NNODES=${NNODES:-1}

if [[ "$NNODES" == "1" ]]; then
  RDZV=(--standalone)
else
  RDZV=(--rdzv-backend c10d --rdzv-endpoint "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port of node 0}" --rdzv-id "${RDZV_ID:-kenotron}")
fi

# One thread per rank on CPU unless the caller chose otherwise (torchrun would otherwise
# warn and pick 1 for multi-process runs; a single CPU process uses every core).
if [[ -z "${OMP_NUM_THREADS:-}" && "$NPROC" != "1" ]]; then export OMP_NUM_THREADS=1; fi

exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" "${RDZV[@]}" \
  --local-ranks-filter "${LOG_RANKS:-0}" --role rank --tee 3 \
  -m kenotron.train --config "$CONFIG_FILE" "$@"
