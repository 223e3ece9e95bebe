"""Muon's state through DCP: saved under FSDP 2 (momentum buffers sharded like their
parameters), resumed in one process, the resumed steps' losses equal to the uninterrupted run's."""

from __future__ import annotations

import pytest
import torch

from kenotron.checkpoint import CheckpointManager, TrainState
from kenotron.checkpoint.model_info import describe_model
from kenotron.config import load_config
from kenotron.config.sections import Checkpoint
from kenotron.models import get_model_spec
from kenotron.train.muon import Muon
from kenotron.train.muon_groups import muon_param_groups
from kenotron.train.optim import optimizer_factory
from tests.checkpoint.tiny import build_model, train_step
from tests.distributed.pool import run_on_ranks


def run_muon_layout(layout: str, folder: str, until: int, save_at: tuple[int, ...] = (), load: bool = False,
                    ) -> dict[int, float]:
    """tests/checkpoint/tiny.py's run_layout with Muon: {step: loss} of the steps trained here."""
    model, dp_rank, dp_size = build_model(layout)
    cfg = load_config(None, ["--optimizer.name", "muon", "--optimizer.lr", "0.02"]).optimizer
    optimizer = optimizer_factory(cfg, "for-loop")(muon_param_groups(model, cfg, "standard"))
    assert isinstance(optimizer, Muon)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    state = TrainState()
    manager = CheckpointManager(
        Checkpoint(enable=True, interval=1), folder, model_parts=[model], optimizers=[optimizer],
        lr_schedulers=[scheduler], train_state=state,
        model_info=describe_model(get_model_spec("llama3"), model.args, "tiny-test"),
    )
    if load:
        assert manager.load() is not None
    losses = {}
    try:
        while state.step < until:
            step = state.step + 1
            losses[step] = train_step(model, optimizer, step, dp_rank, dp_size)
            scheduler.step()
            state.step = step
            if step in save_at:
                manager.save(step)
    finally:
        manager.close()
    return losses


def test_muon_fsdp2_checkpoint_resumes_in_one_process_with_the_same_losses(tmp_path):
    reference = run_on_ranks(2, run_muon_layout, "fsdp", str(tmp_path), 4, (2,))[0]
    resumed = run_muon_layout("single", str(tmp_path), 4, load=True)
    assert sorted(resumed) == [3, 4]
    # A resume without the momentum buffers steps along the new gradient alone: step 4 differs by ~1e-3.
    for step in (3, 4):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-5), f"loss at step {step}"
