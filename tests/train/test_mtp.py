"""Multi-token prediction through the trainer (train/mtp.py): one rank, deepseek_v3's debug model
with a dense first block, an MoE block and one MTP module: the MTP loss reaches metrics.jsonl and
falls, the MoE metrics name the MoE block by its index, and the MTP loss trains the shared weights
(the same first loss as without MTP, other losses after)."""

from __future__ import annotations

from tests.train.short_run import read_records, train_short_run

# No balancing terms: the MTP block's router would otherwise change the main routers' loss weights.
MODEL = ["--model.name", "deepseek_v3", "--training.local_batch_size", "8", "--moe.aux_loss_coef", "0"]


def test_mtp_loss_and_moe_loads_reach_the_records_and_the_mtp_loss_trains_the_model(tmp_path):
    train_short_run(2, MODEL + ["--model.mtp_depth", "1"], str(tmp_path / "mtp"))
    train_short_run(2, MODEL, str(tmp_path / "none"))
    records, without = read_records(tmp_path / "mtp"), read_records(tmp_path / "none")
    assert records[-1]["mtp_loss/1"] < records[0]["mtp_loss/1"]
    assert "moe_load_max/1" in records[-1] and "moe_load_max/0" not in records[-1]  # block 0 is dense
    assert records[0]["moe_load_mean/1"] == 8 * 32 * 2 / 8  # token copies per expert
    assert "mtp_loss/1" not in without[0]
    assert records[0]["loss"] == without[0]["loss"] and records[-1]["loss"] != without[-1]["loss"]
