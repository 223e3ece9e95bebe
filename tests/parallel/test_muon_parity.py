"""Muon under every layout against one rank (CPU/gloo, fp32 Newton–Schulz): FSDP 2, TP 2,
FSDP 2 x TP 2, ZeRO-1 2, PP 2 on the debug Llama, EP 2 on the debug Qwen3-MoE (its experts'
3-D weights). Two steps through the trainer; the losses and every parameter after them within
fp32 tolerance of the 1-rank run, so each matrix was orthogonalized whole (a shard's own
orthogonal form differs by O(1))."""

from __future__ import annotations

import pytest
import torch

from kenotron.config import load_config
from kenotron.train.muon_groups import muon_names
from kenotron.train.step import clip_gradients, forward_backward, optimizer_step
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import BASE, full, named_parameters

STEPS = 2
MUON = ["--optimizer.name", "muon", "--optimizer.lr", "0.02", "--model.n_layers", "2"]
MOE = ["--model.name", "qwen3_moe", "--model.flavor", "debug", "--training.local_batch_size", "8"]
LAYOUTS = {
    "fsdp2": (2, []),
    "tp2": (2, ["--parallelism.tp", "2", "--training.local_batch_size", "8"]),
    "fsdp2_tp2": (4, ["--parallelism.tp", "2"]),
    "zero1_2": (2, ["--parallelism.dp_mode", "zero1"]),
    "pp2": (2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "GPipe", "--parallelism.dp_shard", "1",
                "--training.local_batch_size", "8"]),
}


def run_muon(overrides: list[str], dump_folder: str) -> dict:
    """Losses of STEPS Muon steps and every parameter after them (whole), from the ranks at
    position 0 of the data and tensor dimensions (each pipeline stage reports its own)."""
    cfg = load_config(None, BASE + MUON + ["--job.dump_folder", dump_folder, "--training.steps", str(STEPS)]
                      + overrides)
    trainer = Trainer(cfg)
    job, losses = trainer.job, []
    for _ in range(STEPS):
        loss = forward_backward(job, trainer.loader.next_step())
        clip_gradients(job)
        optimizer_step(job)
        losses.append(trainer.global_losses([loss])[0].item())
    params = {name: full(p) for name, p in named_parameters(trainer)}
    muon = set().union(*(muon_names(part, [], []) for part in job.model_parts))
    reports = all(job.meshes.coordinate(d) == 0 for d in ("dp_replicate", "dp_shard", "cp", "tp"))
    trainer.close()
    return {"losses": losses, "params": params if reports else {}, "muon": muon}


def assert_same(reference: dict, results: list[dict], tol: float = 2e-5, adamw_tol: float = 1e-3) -> None:
    """Losses and Muon's matrices within `tol`; AdamW's parameters (embeddings, output, norms)
    within `adamw_tol`: AdamW's first steps divide each gradient entry by its own size, so an
    entry near zero turns a 1e-7 reduction-order difference into up to ~lr (0.02) apart."""
    for rank, res in enumerate(results):
        assert res["losses"] == pytest.approx(reference["losses"], abs=tol), f"rank {rank}"
    params: dict[str, torch.Tensor] = {}
    for res in results:
        params.update(res["params"])
    assert set(params) >= set(reference["params"]) - {"output.weight"}, set(reference["params"]) - set(params)
    for name, ref in reference["params"].items():
        if name in params:
            diff = (params[name] - ref).abs().max().item()
            assert diff <= (tol if name in reference["muon"] else adamw_tol), f"{name} differs by {diff}"


@pytest.fixture(scope="module")
def dense_reference(tmp_path_factory):
    return run_muon([], str(tmp_path_factory.mktemp("ref")))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_muon_layout_matches_one_rank(layout, dense_reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    assert_same(dense_reference, run_on_ranks(world, run_muon, overrides, str(tmp_path)))


def test_muon_expert_parallel_matches_one_rank(tmp_path):
    reference = run_muon(MOE, str(tmp_path / "ref"))
    results = run_on_ranks(2, run_muon, MOE + ["--parallelism.ep", "2", "--training.local_batch_size", "4"],
                           str(tmp_path / "ep2"))
    assert "layers.0.feed_forward.experts.w13" in reference["muon"], sorted(reference["muon"])
    assert_same(reference, results)


def orthogonalize_sharded(how: str) -> float:
    """Largest difference between the whole orthogonalized matrices and those made from shards
    over 2 ranks: uneven rows and columns, batches of 1 and 3, a 3-D batch sharded on any dim."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from kenotron.train.muon_layout import orthogonalize
    from kenotron.train.newton_schulz import newton_schulz

    def ns(x):
        return newton_schulz(x, 5, torch.float32)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    cases = [((7, 6), Shard(0), 1), ((7, 6), Shard(1), 3), ((5, 9), Shard(0), 3), ((3, 8, 6), Shard(0), 1),
             ((3, 8, 6), Shard(2), 1)]
    for shape, placement, k in cases:
        whole = [torch.randn(shape, generator=g) for _ in range(k)]
        sharded = [distribute_tensor(m, mesh, [placement]) for m in whole]
        for m, d, o in zip(whole, sharded, orthogonalize(sharded, ns, how, torch.float32)):
            full = DTensor.from_local(o, mesh, [placement], run_check=False, shape=d.shape, stride=d.stride())
            worst = max(worst, (full.full_tensor() - ns(m)).abs().max().item())
    return worst


@pytest.mark.parametrize("how", ["owner", "every_rank"])
def test_sharded_matrices_are_orthogonalized_whole_either_way(how):
    assert max(run_on_ranks(2, orthogonalize_sharded, how)) < 1e-5
