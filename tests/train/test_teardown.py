"""The end of a run leaves no collective in flight (a gloo all-gather completing while the
interpreter shuts down aborted ranks with SIGABRT, 'terminate called without an active exception')."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from kenotron.config import load_config
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks


def _pending_all_gathers_after_training(folder: str) -> int:
    cfg = load_config(None, [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--training.steps", "2", "--metrics.tensorboard", "false", "--job.dump_folder", folder,
        "--parallelism.dp_shard", str(dist.get_world_size()),
    ])
    trainer = Trainer(cfg)
    try:
        assert trainer.job.early_gather is not None, "the case under test: FSDP's early all-gathers are on"
        trainer.train()
        units = [m for m in trainer.job.model.modules() if isinstance(m, FSDPModule)]
        return sum(1 for u in units if u._get_fsdp_state()._fsdp_param_group._all_gather_result is not None)
    finally:
        trainer.close()


def test_no_fsdp_all_gather_is_left_in_flight_when_training_ends(tmp_path):
    assert run_on_ranks(2, _pending_all_gathers_after_training, str(tmp_path)) == [0, 0]
