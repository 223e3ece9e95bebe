"""The MoE layers' load balancing over a job: what the step does around their routers.

    balance = ExpertBalance(job)        # attached by build_job when the model has MoE layers
    balance.set_loss_weights(units)     # before forward_backward: how much each router's terms weigh
    ...forward / backward...
    balance.after_step()                # after the optimizer step: loads summed over ranks, bias update
    balance.metrics()                   # the trainer, at log steps: per-layer loads and losses, and a
                                        #   warning naming a collapsed layer (device values: one read)

It is one of the job's extensions (train/extension.py): the step and the loop call it through
the hooks below.

Loss weights: the step's loss is the token cross-entropy + moe.aux_loss_coef x the auxiliary
loss (mean over MoE layers and micro-batches, each micro-batch's over all its ranks) +
moe.z_loss_coef x the z-loss (mean over MoE layers and the step's tokens). Each router adds
its share through its layer's output (models/common/router.py); like the cross-entropy it is
multiplied by the data-parallel averaging size, which the gradient averaging divides out.

After each optimizer step the routers' loads (token copies per expert) are summed over the
ranks holding other tokens of the step (and, for the metrics, the pipeline stages); with
moe.bias_update_rate > 0 each expert's bias moves by rate x sign(mean load - its load)
(centered, DeepSeek-V3's auxiliary-loss-free balancing), identically on every rank.

Nothing here reads the device on the host during a step: the loads, losses, bias updates and
collapse streaks stay on the device, and the metrics hand the trainer device values that it
reads with the rest of the log record in one copy (train/metrics.py's `read_on_host`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from kenotron.data import MicroBatch
from kenotron.models.common.router import TopKRouter
from kenotron.train.extension import JobExtension
from kenotron.train.metrics import Deferred
from kenotron.train.training_job import TrainingJob

logger = logging.getLogger("kenotron")

COLLAPSE_SHARE = 0.9
"""A router has collapsed when one expert takes more than this share of the tokens ..."""
COLLAPSE_STEPS = 100
"""... for this many steps in a row (looked at in each log record's one read)."""


class ExpertBalance(JobExtension):
    """The routers of this rank's model parts, named by their layer (see the module docstring)."""

    name = "experts"

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.routers: dict[str, TopKRouter] = {}
        for part in job.model_parts:
            for name, module in part.named_modules():
                if isinstance(module, TopKRouter):
                    layer = name.split(".")[1] if name.startswith("layers.") else name
                    self.routers[layer] = module
        moe = job.run.model_args.moe
        self.n_experts, self.top_k = moe.n_experts, moe.top_k
        self.moe_layer_ids = _moe_layer_ids(job)
        self.n_layers = len(self.moe_layer_ids)
        self.layer_ids = sorted(self.routers, key=lambda s: int(s) if s.isdigit() else 0)
        self.streak = torch.zeros(len(self.routers), dtype=torch.int64, device=job.device)
        self.warned: set[str] = set()
        self.last: torch.Tensor | None = None
        """(local layers, experts + 2): the last step's loads summed over ranks, then its mean
        auxiliary loss and mean z-loss per layer."""

    def set_loss_weights(self, units: int) -> None:
        """Weights of the routers' terms for a step of `units` micro-batches (x pipeline microbatches)."""
        cfg, job = self.job.run.cfg.moe, self.job
        scale = job.applied.data_parallel.averaging_size / (units * self.n_layers)
        for router in self.routers.values():
            router.balance.aux = cfg.aux_loss_coef * scale
            router.balance.z = cfg.z_loss_coef * scale

    def before_forward_backward(self, microbatches: Sequence[MicroBatch]) -> None:
        plan = self.job.run.plan
        pipelined = plan.pipeline.microbatches if self.job.applied.stage_ids else 1
        self.set_loss_weights(len(microbatches) * pipelined)

    def after_optimizer_step(self) -> None:
        self.after_step()

    @torch.no_grad()
    def after_step(self) -> None:
        """Sum the step's loads over the ranks, move the biases, update the collapse streaks,
        and start the next step's statistics."""
        routers = [self.routers[i] for i in self.layer_ids]
        if not routers:  # a pipeline stage of dense blocks only: no rows, but the metrics' collective joins
            self.last = torch.zeros(0, self.n_experts + 2, device=self.job.device)
            return
        units = torch.stack([r.units for r in routers]).clamp(min=1)
        stats = torch.cat([torch.stack([r.load for r in routers]), torch.stack([r.z_sum for r in routers])[:, None]], 1)
        tokens = self.job.meshes.get("dp_cp_tp")
        if tokens is not None:
            dist.all_reduce(stats, group=tokens.get_group())
        loads = stats[:, :-1]
        step_tokens = self.job.run.global_batch_size * self.job.run.cfg.training.seq_len
        aux = torch.stack([r.aux_sum for r in routers]) / units
        z = stats[:, -1] / step_tokens
        self.last = torch.cat([loads, aux[:, None], z[:, None]], 1)
        rate = self.job.run.cfg.moe.bias_update_rate
        if rate:
            delta = torch.sign(loads.mean(1, keepdim=True) - loads)
            delta = rate * (delta - delta.mean(1, keepdim=True))
            for router, d in zip(routers, delta):
                router.expert_bias.add_(d)
        share = loads.max(1).values * self.top_k / loads.sum(1).clamp(min=1)
        self.streak = torch.where(share > COLLAPSE_SHARE, self.streak + 1, 0)
        for router in routers:
            router.reset_statistics()

    def warn_collapsed(self, streaks: list[float]) -> dict[str, Any]:
        """Warn once for each layer whose router has sent more than 90% of the tokens to one expert
        for COLLAPSE_STEPS steps in a row, from the collapse streaks read on the host in the log
        record's one read (`metrics`); no record keys."""
        for layer, streak in zip(self.layer_ids, streaks):
            streak = int(streak)
            if streak >= COLLAPSE_STEPS and layer not in self.warned:
                self.warned.add(layer)
                logger.warning(
                    "MoE router of layer %s has collapsed: one expert took over %d%% of the tokens for %d steps; "
                    "raise moe.aux_loss_coef or moe.bias_update_rate, or lower optimizer.lr",
                    layer, int(COLLAPSE_SHARE * 100), streak)
            elif streak < COLLAPSE_STEPS:
                self.warned.discard(layer)
        return {}

    def metrics(self) -> dict[str, Any]:
        """The last step's per-layer loads and losses for metrics.jsonl, every layer of the
        model (collective over the pipeline ranks): moe_load_max/<layer> and moe_load_mean/<layer>
        (token copies per expert), moe_aux/<layer>, and the means aux_loss and z_loss; as device
        values (0-d tensors), with this rank's collapse streaks (`warn_collapsed`) deferred to the
        trainer's one read."""
        if self.last is None:
            return {}
        total = max(self.n_layers, 1)
        table = torch.zeros(total, self.n_experts + 2, device=self.last.device)
        row_of = {layer: i for i, layer in enumerate(self.moe_layer_ids)}
        for row, layer in zip(self.last, self.layer_ids):
            table[row_of.get(layer, 0)] = row
        pp = self.job.meshes.get("pp")
        if pp is not None:
            dist.all_reduce(table, group=pp.get_group())
        loads, means = table[:, :-2], table.mean(0)
        load_max, load_mean = loads.max(1).values, loads.mean(1)
        out: dict[str, Any] = {"aux_loss": means[-2], "z_loss": means[-1]}
        for i, layer in enumerate(self.moe_layer_ids or ["0"]):
            out[f"moe_load_max/{layer}"] = load_max[i]
            out[f"moe_load_mean/{layer}"] = load_mean[i]
            out[f"moe_aux/{layer}"] = table[i, -2]
        out["moe_collapse"] = Deferred(self.streak, self.warn_collapsed)
        return out


def _moe_layer_ids(job: TrainingJob) -> list[str]:
    """The blocks holding an MoE layer in the whole model (every pipeline stage), in order: not
    every block has one (DeepSeek-V3's first blocks are dense)."""
    with torch.device("meta"):
        model = job.run.spec.build(job.run.model_args)
    ids = [name.split(".")[1] if name.startswith("layers.") else name
           for name, m in model.named_modules() if isinstance(m, TopKRouter)]
    return sorted(ids, key=lambda s: int(s) if s.isdigit() else 0)
