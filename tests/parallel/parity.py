"""Shared pieces of the parity tests: run a few trainer steps and report loss, norm, gradients.

The same function runs in the test process (the 1-rank reference, no process group) and on
the ranks of the harness (the layout under test), so both go through exactly the trainer's
code path: config -> Trainer (resolve_run, build_job, loader) -> the step's functions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from kenotron.config import load_config
from kenotron.dtensor import full_tensor, local_tensor
from kenotron.parallel.plan import Plan
from kenotron.train.metrics import read_on_host
from kenotron.train.step import clip_gradients, forward_backward, optimizer_step
from kenotron.train.trainer import Trainer

BASE = [
    "--model.n_layers", "2", "--training.seq_len", "32", "--training.global_batch_size", "8",
    "--training.local_batch_size", "2", "--optimizer.name", "sgd", "--optimizer.lr", "0.5",
    "--training.max_norm", "1.0", "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay", "constant",
    "--metrics.tensorboard", "false",
    # CPU on every machine: the pool's ranks share one gloo group, so on a GPU machine "auto" would
    # put every rank's CUDA tensors on that group (ranks sharing a GPU), a layout no launcher builds.
    "--training.device", "cpu",
]


def full(t: torch.Tensor) -> torch.Tensor:
    return full_tensor(t).detach().float().cpu().clone()


def named_parameters(trainer: Trainer) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """Every parameter of this rank's model parts (pipeline stages keep the whole model's names)."""
    for part in trainer.job.model_parts:
        yield from part.named_parameters()


def run_steps(
    overrides: list[str], dump_folder: str, steps: int = 2, edit_plan: Callable[[Plan], None] | None = None
) -> dict:
    """Losses and grad norms of `steps` steps, and every gradient of the first step. Two steps by
    default: the second's loss and norm already start from the first's update, and the plain SGD
    the parity tests run keeps no state that a third step would check further.

    Gradients come back gathered over data and tensor parallel from the ranks at position 0 of
    those dimensions: rank 0 alone, or one rank per pipeline stage (assert_parity merges them).
    A tied weight's second copy on another stage is left out (it equals the first).
    `edit_plan` (a module-level function) changes the plan the config produced, as a user
    editing a Plan object would.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    cfg = load_config(None, BASE + ["--job.dump_folder", dump_folder, "--training.steps", str(steps)] + overrides)
    trainer = Trainer(cfg, edit_plan)
    assert trainer.run.dims.world_size == world
    job = trainer.job
    losses, norms, grads, grad_local_shapes = [], [], {}, {}
    mtp, mtp_losses = job.extension("mtp"), []  # multi-token prediction's loss per module, per step
    duplicates = job.pipeline.norm_duplicates() if job.pipeline is not None else set()
    for step in range(steps):
        loss = forward_backward(job, trainer.loader.next_step())
        if step == 0:
            grads = {name: full(p.grad) for name, p in named_parameters(trainer) if id(p) not in duplicates}
            grad_local_shapes = {
                name: tuple(local_tensor(p.grad).shape)
                for name, p in named_parameters(trainer)
            }
        norms.append(clip_gradients(job).item())
        optimizer_step(job)
        losses.append(trainer.global_losses([loss])[0].item())
        if mtp is not None:  # collective: every rank
            mtp_losses.append(read_on_host(mtp.metrics()))
    # Which token exchange each MoE layer ran (expert parallel picks one per layout).
    dispatchers = sorted({type(m.dispatcher).__name__ for part in job.model_parts for m in part.modules()
                          if hasattr(m, "dispatcher")})
    trainer.close()
    reports = all(job.meshes.coordinate(d) == 0 for d in ("dp_replicate", "dp_shard", "cp", "tp"))
    # What this rank actually holds, so a test can tell a sharded layout from a replicated one.
    local_shapes = {
        name: tuple(local_tensor(p).shape) for name, p in named_parameters(trainer)
    }
    dtensors = sorted(name for name, p in named_parameters(trainer) if isinstance(p, DTensor))
    # Which modules are FSDP units, and which parameters some unit manages (shards, gathers, reduces).
    units = [(name, m) for part in job.model_parts for name, m in part.named_modules() if isinstance(m, FSDPModule)]
    managed = {id(fp.sharded_param) for _, m in units for group in _param_groups(m) for fp in group.fsdp_params}
    # The parameters this rank's optimizers step (under ZeRO-1 the rank's own partition).
    names = {id(p): name for name, p in named_parameters(trainer)}
    stepped = sorted(names[id(p)] for o in job.torch_optimizers for g in o.param_groups for p in g["params"]
                     if id(p) in names)
    return {
        "losses": losses, "norms": norms, "mtp_losses": mtp_losses, "grads": grads if reports else None, "local_shapes": local_shapes,
        "dtensor_params": dtensors, "optimizer_params": stepped,
        "grad_local_shapes": grad_local_shapes, "stage_ids": list(job.applied.stage_ids),
        "dispatchers": dispatchers, "fsdp_units": sorted(name for name, _ in units),
        "fsdp_params": sorted(name for name, p in named_parameters(trainer) if id(p) in managed),
    }


def _param_groups(module: FSDPModule) -> list:
    """The FSDP parameter groups of one unit (private state: a list in newer torch, one group in 2.11)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        groups = [state._fsdp_param_group] if state._fsdp_param_group is not None else []
    return list(groups)


def assert_parity(reference: dict, results: list[dict], loss_tol: float, grad_tol: float) -> dict[str, float]:
    """Check every rank's losses and norms and the (merged) gradients; returns the largest
    differences found: {"loss": ..., "norm": ..., "grad": ...}."""
    worst = {"loss": 0.0, "norm": 0.0, "grad": 0.0}
    for rank, res in enumerate(results):
        for step, (a, b) in enumerate(zip(reference["losses"], res["losses"])):
            worst["loss"] = max(worst["loss"], abs(a - b))
            assert abs(a - b) <= loss_tol, f"rank {rank} step {step + 1}: loss {b} vs reference {a}"
        for step, (a, b) in enumerate(zip(reference["norms"], res["norms"])):
            worst["norm"] = max(worst["norm"], abs(a - b))
            assert abs(a - b) <= max(loss_tol, 1e-6) * max(1.0, a), f"rank {rank} step {step + 1}: norm {b} vs {a}"
    grads: dict[str, torch.Tensor] = {}
    for res in results:
        grads.update(res["grads"] or {})
    assert set(grads) == set(reference["grads"]), set(grads) ^ set(reference["grads"])
    for name, ref in reference["grads"].items():
        diff = (grads[name] - ref).abs().max().item()
        worst["grad"] = max(worst["grad"], diff)
        assert diff <= grad_tol, f"gradient of {name} differs by {diff}"
    return worst


SHORT_DOCUMENT_WORDS = ["the", "a", "model", "token", "window", "rank", "chunk", "border", "mask", "ring", "layer",
                        "head", "tail", "document"]


def write_short_documents(path: Path) -> list[str]:
    """Write 400 documents of 1-12 seeded random words to `path` (JSON Lines) and return the
    overrides that train on them with document masking: many documents per sequence, so they
    cross chunk and rank borders under context parallel."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": " ".join(rng.choices(SHORT_DOCUMENT_WORDS, k=rng.randint(1, 12)))}) + "\n")
    return ["--data.dataset", "jsonl", "--data.path", str(path), "--data.document_masking", "true"]
