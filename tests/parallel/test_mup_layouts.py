"""Spectral µP gives the same initial weights and per-parameter learning rates under tensor
parallel and FSDP as on one rank (the fans are the whole matrices', never a shard's), and so
the same training."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from kenotron.config import load_config
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import full, named_parameters

MUP = [
    "--model.n_layers", "1", "--model.dim", "128", "--model.n_heads", "4", "--model.n_kv_heads", "2",
    "--model.ffn_dim", "384", "--model.parametrization", "spectral_mup", "--training.seq_len", "32",
    "--training.global_batch_size", "4", "--training.local_batch_size", "2", "--optimizer.lr", "1e-2",
    "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay", "constant", "--metrics.tensorboard", "false",
]


def init_rates_and_losses(overrides: list[str], dump_folder: str, steps: int = 2) -> dict:
    """Full initial weights, each parameter's learning rate, and `steps` losses."""
    cfg = load_config(None, MUP + ["--job.dump_folder", dump_folder, "--training.steps", str(steps)] + overrides)
    trainer = Trainer(cfg)
    names = {id(p): name for name, p in named_parameters(trainer)}
    rates = {names[id(p)]: g["lr"] for o in trainer.job.torch_optimizers for g in o.param_groups for p in g["params"]}
    weights = {name: full(p) for name, p in named_parameters(trainer)}
    losses = [trainer.global_losses([trainer.run_step(trainer.loader.next_step())[0]])[0].item()
              for _ in range(steps)]
    trainer.close()
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    return {"rates": rates, "weights": weights if rank0 else None, "losses": losses}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return init_rates_and_losses([], str(tmp_path_factory.mktemp("mup1")))


@pytest.mark.parametrize(("layout", "overrides"), [
    ("tp2", ["--parallelism.tp", "2", "--training.local_batch_size", "4"]),
    ("fsdp2", []),
])
def test_spectral_mup_init_and_rates_match_one_rank(layout, overrides, one_rank, tmp_path):
    results = run_on_ranks(2, init_rates_and_losses, overrides, str(tmp_path))
    ref = one_rank
    # The base rate (embedding, vectors), 256/128 (fan-in 128) and 256/384 (w2).
    assert sorted(set(ref["rates"].values())) == pytest.approx([1e-2 * 256 / 384, 1e-2, 1e-2 * 2])
    for res in results:
        assert res["rates"] == ref["rates"]
        assert res["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    for name, w in ref["weights"].items():
        assert (results[0]["weights"][name] - w).abs().max().item() == 0.0, name
