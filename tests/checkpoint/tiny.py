"""A small Llama under three layouts (1 process, FSDP2, FSDP2 x TP) for checkpoint tests.

Layouts are built here with `fully_shard` / `parallelize_module` directly, so these tests do not
depend on kenotron's parallel plans. Everything that runs on the ranks of tests/distributed/pool.py
lives at module level.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kenotron.checkpoint import CheckpointManager, TrainState
from kenotron.checkpoint.model_info import describe_model
from kenotron.config.sections import Checkpoint
from kenotron.models import get_model_spec

VOCAB, SEQ, BATCH = 256, 16, 4


def tiny_args(n_layers: int = 2, vocab_size: int = VOCAB, max_seq_len: int = SEQ, **fields):
    return get_model_spec("llama3").model_args("debug", n_layers=n_layers, vocab_size=vocab_size,
                                               max_seq_len=max_seq_len, **fields)


def build_model(layout: str = "single", **arg_changes) -> tuple[nn.Module, int, int]:
    """(model, dp rank, dp size) for layout "single", "fsdp" (all ranks) or "fsdp_tp" (dp x 2);
    `arg_changes` (n_layers, vocab_size, rope_theta, ...: Llama3Args fields) change the model."""
    return build_llama(tiny_args(**arg_changes), layout)


def build_llama(args, layout: str = "single") -> tuple[nn.Module, int, int]:
    """A Llama 3 of `args` under `layout` (see build_model), initialized from seed 0."""
    spec = get_model_spec("llama3")
    with torch.device("meta"):
        model = spec.build(args)
    dp_rank, dp_size = 0, 1
    if layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size()
    elif layout == "fsdp_tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
        apply_tp(model, mesh["tp"])
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        dp_rank, dp_size = mesh.get_local_rank("dp"), mesh["dp"].size()
    elif layout != "single":
        raise ValueError(f"unknown layout {layout!r}")
    model.to_empty(device="cpu")
    model.init_weights(buffer_device="cpu", seed=0)
    return model, dp_rank, dp_size


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Megatron-style TP without sequence parallel: column-parallel in, row-parallel out."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    })
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        })


def batch(step: int) -> torch.Tensor:
    """The global batch of `step`: the same on every rank and in every layout."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def train_step(model, optimizer, step: int, dp_rank: int, dp_size: int, before_step=None) -> float:
    """One AdamW step on this dp rank's slice of batch(step); returns the global mean loss."""
    tokens = batch(step).chunk(dp_size)[dp_rank]
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    loss.backward()
    if before_step is not None:
        before_step()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss = loss.detach()
    if dp_size > 1:
        # FSDP averages gradients over dp, so average the loss alike (TP ranks hold equal copies).
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()


def eval_loss(model, step: int) -> float:
    """Loss of the full batch(step) without training (1 process)."""
    tokens = batch(step)
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()


def make_run(layout: str, folder: str | Path, arg_changes: dict | None = None, **config) -> tuple:
    """(model, optimizer, scheduler, train_state, manager, dp_rank, dp_size) for a fresh run;
    `config` sets fields of the Checkpoint section."""
    model, dp_rank, dp_size = build_model(layout, **(arg_changes or {}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0 / (i + 1))
    train_state = TrainState()
    settings = Checkpoint(**{"enable": True, "interval": 1, **config})
    manager = CheckpointManager(
        settings, folder, model_parts=[model], optimizers=[optimizer], lr_schedulers=[scheduler],
        train_state=train_state, model_info=describe_model(get_model_spec("llama3"), model.args, "tiny-test"),
    )
    return model, optimizer, scheduler, train_state, manager, dp_rank, dp_size


def run_layout(layout: str, folder: str, *, until: int, save_at: tuple[int, ...] = (), load: bool = False,
               **config) -> dict[int, float]:
    """Train to step `until` (after resuming from the latest checkpoint when `load`), saving at
    `save_at`; returns {step: loss} of the steps trained here."""
    model, optimizer, scheduler, state, manager, dp_rank, dp_size = make_run(layout, folder, **config)
    if load:
        assert manager.load() is not None, f"nothing to resume from in {folder}"
    losses = {}
    try:
        while state.step < until:
            step = state.step + 1
            losses[step] = train_step(model, optimizer, step, dp_rank, dp_size, before_step=manager.wait_for_staging)
            scheduler.step()
            state.step = step
            if step in save_at:
                manager.save(step)
    finally:
        manager.close()
    return losses
