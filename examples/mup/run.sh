#!/usr/bin/env bash
# Spectral µP on CPU: a small coordinate check of both parametrizations (a PNG and the width
# exponents), then a model twice as wide as the debug flavor trained with the learning rate
# tuned on narrow ones. OUT is the output folder (default outputs/example-mup); extra arguments
# (--section.key value) go to the training run. --tiny (first): a coordinate check of 2 steps
# on shorter batches, and 4 steps of the wide model with one block.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/lib.sh
export CONFIG_FILE=examples/mup/config.toml NPROC=${NPROC:-1}
OUT=${OUT:-outputs/example-mup}
CHECK=(--steps 3 -- --model.n_layers 1 --training.seq_len 32 --training.local_batch_size 4)
if [[ "${1:-}" == --tiny ]]; then
    shift
    CHECK=(--steps 2 -- "${TINY[@]}")
    set -- "${TINY[@]}" --training.steps 4 --metrics.log_freq 2 --lr_scheduler.warmup_steps 1 "$@"
fi

python scripts/mup_coord_check.py --widths 64,128,256 --out "$OUT/coord_check.png" --json "$OUT/coord_check.json" \
    "${CHECK[@]}"
train --job.dump_folder "$OUT/wide" "$@"
