# Sourced by the examples' run.sh, from the repository root.

# train --section.key value ...: one training run of $CONFIG_FILE on $NPROC processes (default 1).
# One process needs no launcher: it is the training process itself, as run_train.sh would start
# it (torchrun's start would be seconds of a minute-long example). A feature that needs torchrun's
# process group even for one process (a separate checkpoint writer) calls ./run_train.sh instead.
train() {
    if [[ "${NPROC:-1}" == 1 ]]; then
        python -m kenotron.train --config "$CONFIG_FILE" "$@"
    else
        ./run_train.sh "$@"
    fi
}

# What `run.sh --tiny` adds to an example's training runs: a one-block model on two sequences of
# 32 tokens a step, so the whole example takes seconds (tests/examples runs every example so).
TINY=(--model.n_layers 1 --training.seq_len 32 --training.local_batch_size 2)
