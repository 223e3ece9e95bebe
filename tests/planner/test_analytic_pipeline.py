"""The closed form of every pipeline schedule kenotron runs (analytic_pipeline.py) agrees with the
fake-tensor simulation of its real order, rank by rank."""

from __future__ import annotations

import pytest

from kenotron.config import load_config
from kenotron.planner import estimate_with_closed_form

PP_TOLERANCE = 0.05
"""As for 1F1B (tests/planner/test_analytic.py): 5% of each pipeline rank's peak (measured with 4
blocks: within 2.8% for every row, the interleaved schedules' last rank the farthest; with 8 blocks
within 2.3%)."""

# Llama 3.2 1B's widths with 4 blocks (the fewest Interleaved1F1B's 4 stages take; 8 cost ~4 s more
# of simulation), 4 microbatches of 1 x 1024 on 2 pipeline ranks.
SHAPE = ["--model.flavor", "1B", "--model.n_layers", "4", "--training.seq_len", "1024", "--training.param_dtype",
         "bfloat16", "--compile.enable", "false", "--parallelism.pp", "2", "--training.local_batch_size", "4"]


@pytest.mark.parametrize(
    "ngpu,overrides",
    [
        (2, ["--parallelism.pp_schedule", "GPipe"]),
        (2, ["--parallelism.pp_schedule", "Interleaved1F1B"]),
        (2, ["--parallelism.pp_schedule", "InterleavedZeroBubble"]),
        (2, ["--parallelism.pp_schedule", "ZBVZeroBubble"]),
        (4, ["--parallelism.pp_schedule", "DualPipeV", "--activation_checkpoint.mode", "none"]),
    ],
    ids=["gpipe-every-microbatch-in-flight", "interleaved-two-stages-per-rank",
         "interleaved-zero-bubble-split-backward", "zbv-first-and-last-stage-on-rank-0", "dualpipev-fsdp2"],
)
def test_closed_form_of_each_schedule_matches_the_simulation_of_its_order(ngpu, overrides):
    report = estimate_with_closed_form(load_config("debug", SHAPE + overrides), ngpu, gpu_memory_gib=80)
    assert len(report.ranks) == 2
    for rank in report.ranks:
        assert rank.analytic is not None, rank.ranks
        assert rank.analytic.total == pytest.approx(rank.peak.total, rel=PP_TOLERANCE), rank.ranks
        assert rank.analytic.parameters == rank.peak.parameters
        assert rank.analytic.optimizer_state == rank.peak.optimizer_state
