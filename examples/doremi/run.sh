#!/usr/bin/env bash
# DoReMi end to end on CPU: a reference model on given domain weights, a proxy that learns the
# weights with group DRO, a main run on the learned weights, and the plots. OUT is the output
# folder (default outputs/example-doremi); extra arguments (--section.key value) go to every run.
# --tiny (first): each run 4 steps of a one-block model on three sequences of 32 tokens a step.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/lib.sh
export CONFIG_FILE=examples/doremi/config.toml NPROC=${NPROC:-1}
OUT=${OUT:-outputs/example-doremi}
if [[ "${1:-}" == --tiny ]]; then  # (three sequences: a proxy's step sees every domain)
    shift
    set -- "${TINY[@]}" --training.local_batch_size 3 --training.steps 4 --metrics.log_freq 2 \
        --lr_scheduler.warmup_steps 1 "$@"
fi

# The domains: the built-in corpus' two parts as JSON Lines files, and random tokens.
python -c "from kenotron.data.sample_data import write_domain_data; write_domain_data('$OUT/data')"
sources() {  # data.sources with the given weights (reference, stdlib, noise)
    echo "[{name = \"reference\", dataset = \"jsonl\", path = \"$OUT/data/reference.jsonl\", weight = $1}," \
         "{name = \"stdlib\", dataset = \"jsonl\", path = \"$OUT/data/stdlib.jsonl\", weight = $2}," \
         "{name = \"noise\", dataset = \"synthetic\", weight = $3}]"
}

# 1. The reference model, on the given weights; its last step is saved.
train --job.dump_folder "$OUT/reference" --data.sources "$(sources 0.5 0.3 0.2)" \
    --checkpoint.enable true "$@"
REFERENCE=$(ls -d "$OUT/reference/checkpoints/step-"* | tail -1)

# 2. The proxy: every domain sampled equally, domain weights learned against the reference.
train --job.dump_folder "$OUT/proxy" --data.sources "$(sources 1 1 1)" \
    --doremi.reference "$REFERENCE" "$@"

# 3. The main run, blended by the learned weights (the proxy's doremi_weights.json).
train --job.dump_folder "$OUT/main" --data.sources "$(sources 1 1 1)" \
    --data.weights_from "$OUT/proxy/doremi_weights.json" "$@"

# The domain weights over time and the per-domain losses (needs matplotlib: the report extra).
if python -c "import matplotlib" 2>/dev/null; then
    python -m kenotron.cli report "$OUT/proxy" --out "$OUT/plots"
fi
