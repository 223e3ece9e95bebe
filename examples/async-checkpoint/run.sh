#!/usr/bin/env bash
# Train 40 of 60 steps with background checkpoints, stop, then run again: the second run
# resumes from step 40 and finishes. OUT is the run folder (default
# outputs/example-async-checkpoint); extra arguments (--section.key value) go to both runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONFIG_FILE=examples/async-checkpoint/config.toml NPROC=${NPROC:-1}
OUT=${OUT:-outputs/example-async-checkpoint}

# Saves at steps 20 and 40, each written in the background while training goes on:
./run_train.sh --job.dump_folder "$OUT" --training.steps 40 "$@"
# A restart: resumes from step 40 and trains to step 60:
./run_train.sh --job.dump_folder "$OUT" "$@"
