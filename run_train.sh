#!/usr/bin/env bash
# Train with kenotron through torchrun (the shortcut for `kenotron train`).
#   ./run_train.sh                                   # debug model, built-in corpus, 1 process on CPU
#   CONFIG_FILE=llama3_8b ./run_train.sh --training.steps 20
#   NPROC=4 ./run_train.sh --parallelism.dp_shard 2 --parallelism.tp 2
# NPROC defaults to the number of visible GPUs, or 1 without GPUs. Multi-node: set NNODES and
# RDZV_ENDPOINT (host:port of node 0) on every node (docs/multi-node.md), or use scripts/slurm_train.sh.
# LOG_RANKS (default 0) lists the local ranks shown on the console; every rank's output is kept
# under <job.dump_folder>/logs/. The exit code is the trainer's: 2 for a config error, 130 for Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")"

ARGS=(--nnodes "${NNODES:-1}" --log-ranks "${LOG_RANKS:-0}")
[[ -n "${NPROC:-}" ]] && ARGS+=(--nproc "$NPROC")
[[ -n "${RDZV_ENDPOINT:-}" ]] && ARGS+=(--rdzv-endpoint "$RDZV_ENDPOINT")
[[ -n "${RDZV_ID:-}" ]] && ARGS+=(--rdzv-id "$RDZV_ID")

exec python -m kenotron.cli train "${ARGS[@]}" --config "${CONFIG_FILE:-debug}" "$@"
