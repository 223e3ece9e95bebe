#!/usr/bin/env bash
# Train 40 of 60 steps with background checkpoints, stop, then run again: the second run
# resumes from step 40 and finishes. Extra arguments (--section.key value) go to both runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONFIG_FILE=examples/async-checkpoint/config.toml NPROC=${NPROC:-1}

./run_train.sh --training.steps 40 "$@"   # saves at steps 20 and 40, each written in the background
./run_train.sh "$@"                       # resumes from step 40 and trains to step 60
