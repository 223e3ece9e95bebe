"""The MTP heads' loss in the fake-tensor estimator: the fused chunked loss (train/mtp.py) keeps no
[tokens, vocab] logits per module."""

from __future__ import annotations

from kenotron.config import load_config
from kenotron.estimate import estimate_memory

# deepseek_v3 16B's widths (vocabulary 102,400, dim 2,048) with 2 blocks: 2 x 2,048 tokens a rank.
WIDTHS_16B = ["--model.n_layers", "2", "--training.seq_len", "2048", "--training.local_batch_size", "2",
              "--parallelism.ep", "4", "--activation_checkpoint.mode", "none", "--compile.enable", "false"]


def test_an_mtp_module_adds_less_than_one_fp32_logits_to_the_16b_activations_and_temporaries():
    def working_bytes(depth: str) -> int:
        # At the forward's peak (the loss, the logits alive): at ep 4 on 4 ranks the routed experts
        # stay outside FSDP, so the MTP block's expert copies (264 MiB) count as activations, and
        # without MTP the step's peak moves into the backward, where the gradients are made.
        estimate = estimate_memory(load_config("deepseek_v3_16b", WIDTHS_16B + ["--model.mtp_depth", depth]), 4)
        peak = estimate.ranks[0].phase_peaks["forward"]
        return peak.activations + peak.temporaries

    logits_fp32 = 2 * 2048 * 102_400 * 4  # 1.56 GiB; plain cross-entropy heads added 4.49 GiB, the fused ones 1.01
    assert working_bytes("1") - working_bytes("0") < logits_fp32
