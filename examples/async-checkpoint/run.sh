#!/usr/bin/env bash
# Train 40 of 60 steps with background checkpoints, stop, then run again: the second run
# resumes from step 40 and finishes. OUT is the run folder (default
# outputs/example-async-checkpoint); extra arguments (--section.key value) go to both runs.
# --tiny (first): the same in 6 steps of a one-block model, saving at steps 2 and 4.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/lib.sh
export CONFIG_FILE=examples/async-checkpoint/config.toml NPROC=${NPROC:-1}
OUT=${OUT:-outputs/example-async-checkpoint}
STOP=40 END=60
if [[ "${1:-}" == --tiny ]]; then
    shift
    STOP=4 END=6
    set -- "${TINY[@]}" --checkpoint.interval 2 --metrics.log_freq 2 --lr_scheduler.warmup_steps 1 "$@"
fi

# The writer process joins torchrun's process group, which run_train.sh makes also for one process.
# Saves at steps 20 and 40, each written in the background while training goes on:
./run_train.sh --job.dump_folder "$OUT" --training.steps "$STOP" "$@"
# A restart: resumes from step 40 and trains to step 60:
./run_train.sh --job.dump_folder "$OUT" --training.steps "$END" "$@"
