#!/usr/bin/env bash
# Spectral µP on CPU: a small coordinate check of both parametrizations (a PNG and the width
# exponents), then a model twice as wide as the debug flavor trained with the learning rate
# tuned on narrow ones. OUT is the output folder (default outputs/example-mup); extra arguments
# (--section.key value) go to the training run.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-outputs/example-mup}

python scripts/mup_coord_check.py --widths 64,128,256 --steps 3 --out "$OUT/coord_check.png" \
    --json "$OUT/coord_check.json" -- --model.n_layers 1 --training.seq_len 32 --training.local_batch_size 4
CONFIG_FILE=examples/mup/config.toml NPROC=${NPROC:-1} ./run_train.sh --job.dump_folder "$OUT/wide" "$@"
