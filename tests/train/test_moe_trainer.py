"""The trainer with an MoE model on 4 CPU ranks: metrics.jsonl losses of every expert-parallel
layout (EP x TP among them) equal the 1-rank run's, and every layer's expert loads reach
metrics.jsonl and TensorBoard; an ep 2 checkpoint resumes at ep 2 on 2 ranks (experts outside
FSDP) and on 4 (experts FSDP units), and resharded on one rank; a checkpoint
with another expert count is refused before training. The layouts run on the pool's ranks;
`./run_train.sh` on several processes is launched end to end by tests/launch/test_two_nodes.py."""

from __future__ import annotations

import shutil

import pytest

from kenotron.checkpoint.errors import CheckpointMismatchError
from kenotron.checkpoint.folders import step_folder_name
from kenotron.config import ConfigError
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, train_short_run

N_LAYERS = 2
MOE = ["--model.name", "qwen3_moe", "--moe.z_loss_coef", "0.001", "--moe.bias_update_rate", "0.001"]
LAYOUTS = {
    "ep4": ["--parallelism.ep", "4", "--training.local_batch_size", "2"],
    "ep2_fsdp4": ["--parallelism.ep", "2", "--training.local_batch_size", "2"],
    "ep2_tp2": ["--parallelism.ep", "2", "--parallelism.tp", "2", "--training.local_batch_size", "4"],
    "ep2_pp2": ["--parallelism.ep", "2", "--parallelism.pp", "2", "--parallelism.pp_schedule", "GPipe",
                "--parallelism.pp_microbatches", "1", "--training.local_batch_size", "4"],
}


@pytest.fixture(scope="module")
def one_rank_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    train_short_run(N_LAYERS, MOE + ["--training.local_batch_size", "8", "--metrics.tensorboard", "true"], str(folder))
    return folder


@pytest.fixture(scope="module")
def one_rank(one_rank_folder):
    return read_records(one_rank_folder)


def assert_losses_match(reference: list[dict], records: list[dict]) -> None:
    assert len(records) == len(reference) == 4  # steps 1, 2, 4, 6
    # AdamW amplifies 1e-9 reduction-order noise in gradients; losses still agree closely.
    for step, (a, b) in enumerate(zip(reference, records)):
        assert abs(a["loss"] - b["loss"]) < 1e-4, f"record {step}: {b['loss']} vs one-rank {a['loss']}"


def assert_expert_metrics(records: list[dict]) -> None:
    """Every layer's loads and losses reach the records (the last stage's layers too, under pp)."""
    for key in ("aux_loss", "z_loss", "moe_load_max/0", "moe_load_mean/1", "moe_aux/1"):
        assert records[-1][key] > 0, key
    assert records[0]["moe_load_mean/1"] == 8 * 32 * 2 / 8  # token copies per expert, all ranks


def test_one_rank_writes_every_layers_expert_loads_to_metrics_and_tensorboard(one_rank, one_rank_folder):
    from tests.runtime.test_run_folder import _tensorboard_steps

    assert_expert_metrics(one_rank)
    for key in ("moe_load_max/1", "moe_load_mean/0", "moe_aux/1", "aux_loss"):
        logged = _tensorboard_steps(one_rank_folder, f"train/{key}")
        assert logged == [(r["step"], round(r[key], 4)) for r in one_rank], key


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_four_rank_metrics_losses_match_one_rank(layout, one_rank, tmp_path):
    run_on_ranks(4, train_short_run, N_LAYERS, MOE + LAYOUTS[layout], str(tmp_path))
    records = read_records(tmp_path)
    assert_losses_match(one_rank, records)
    assert_expert_metrics(records)


def test_ep2_checkpoint_resumes_on_one_rank_and_another_expert_count_is_refused(one_rank, tmp_path):
    saving = ["--checkpoint.enable", "true", "--checkpoint.interval", "2"]
    run_on_ranks(2, train_short_run, N_LAYERS, MOE + saving + ["--parallelism.ep", "2", "--training.local_batch_size",
                                                                "4"], str(tmp_path))
    ep2 = read_records(tmp_path)
    assert_losses_match(one_rank, ep2)
    # At ep 2 on 2 ranks the experts stay outside FSDP (efsdp is one rank); at ep 2 on 4 ranks they
    # are FSDP units over efsdp 2: the step-4 checkpoint resumes in both layouts, each in a copy.
    for world, batch in ((2, "4"), (4, "2")):
        copy = tmp_path.parent / f"{tmp_path.name}_ep2_on_{world}"
        shutil.copytree(tmp_path, copy)
        (copy / "metrics.jsonl").unlink()
        run_on_ranks(world, train_short_run, N_LAYERS, MOE + saving + [
            "--checkpoint.load_step", "4", "--parallelism.ep", "2", "--training.local_batch_size", batch], str(copy))
        resumed = read_records(copy)[-1]
        assert resumed["step"] == 6 and abs(resumed["loss"] - ep2[-1]["loss"]) < 1e-5, (world, resumed["loss"])
    (tmp_path / "metrics.jsonl").unlink()
    resume = saving + ["--checkpoint.load_step", "4", "--training.local_batch_size", "8"]
    train_short_run(N_LAYERS, MOE + resume, str(tmp_path))
    resumed = read_records(tmp_path)[-1]  # steps 5 (the first of this launch) and 6
    assert resumed["step"] == 6 and abs(resumed["loss"] - ep2[-1]["loss"]) < 1e-5
    # Another expert count is another model: the run folder refuses to resume it, and its weights
    # refuse to start a model of 4 experts, naming the count to set.
    fewer = ["--model.moe.n_experts", "4"]
    with pytest.raises(ConfigError, match=r"holds a run of another model or data \(model.moe \(flavor\) -> "):
        train_short_run(N_LAYERS, MOE + resume + fewer, str(tmp_path))
    start = ["--checkpoint.enable", "true", "--checkpoint.initial_load_path",
             str(tmp_path / "checkpoints" / step_folder_name(4))]
    with pytest.raises(CheckpointMismatchError, match="MoE layers have 8 experts, the model here 4: set "
                                                      "model.moe.n_experts=8"):
        train_short_run(N_LAYERS, MOE + start + fewer, str(tmp_path / "fresh"))
