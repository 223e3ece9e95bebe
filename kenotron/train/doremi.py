"""DoReMi (Xie et al., 2023, "DoReMi: Optimizing Data Mixtures Speeds Up Language Model
Pretraining"): learn a blend's domain weights with a small proxy model, then train on them.

    1. reference run: train a model on the blend's given weights (data.sources) as usual;
    2. proxy run (doremi.reference = a checkpoint of 1): the same shape, sampling every domain
       equally; each step, with the reference's and the proxy's per-token losses ℓ_ref, ℓ_θ,
         λ_t[i] = Σ_{tokens of domain i} max(ℓ_θ − ℓ_ref, 0) / (tokens of domain i)
         α_t    = (1 − c) · normalize(α_{t−1} ⊙ exp(η λ_t)) + c / k          (α_0 uniform)
       and the proxy steps on Σ_i α_t[i] · (mean token loss of domain i) (group DRO);
       the learned weights are ᾱ = mean over steps of α_t, written to doremi_weights.json;
    3. main run: data.weights_from = that file.

λ_t needs the whole global batch (every micro-batch, every rank) before the proxy's gradient,
so a proxy step runs two passes: the losses of both models without gradients, one all-reduce
of the per-domain sums, the weight update, then forward and backward of the weighted loss.
`DoReMi` is one of the job's extensions (train/extension.py): it runs the step's passes in
place of the plain ones; `build_job` builds the reference model under the same plan and loads
its weights; the checkpoints keep the domain weights, the run folder doremi_weights.json. Its
config checks are train/doremi_checks.py.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kenotron.checkpoint import CheckpointManager
from kenotron.config.sections import Checkpoint
from kenotron.data import MicroBatch
from kenotron.data.build import source_specs
from kenotron.train.extension import JobExtension
from kenotron.train.loss import IGNORE_INDEX
from kenotron.train.step import step_context
from kenotron.train.training_job import TrainingJob

logger = logging.getLogger("kenotron")

WEIGHTS_FILE = "doremi_weights.json"


class DomainWeights:
    """α_t, its running sum (for ᾱ) and the step count: the update rule of the module docstring."""

    def __init__(self, names: Sequence[str], step_size: float = 1.0, smoothing: float = 1e-3) -> None:
        if len(names) < 2:
            raise ValueError(f"DoReMi needs at least two domains, got {list(names)}")
        self.names = list(names)
        self.step_size, self.smoothing = step_size, smoothing
        k = len(self.names)
        self.alpha = torch.full((k,), 1.0 / k, dtype=torch.float64)
        self.total = torch.zeros(k, dtype=torch.float64)
        self.steps = 0

    def update(self, excess: torch.Tensor) -> torch.Tensor:
        """One step: λ_t (`excess`, per domain, already clipped at 0 token by token) -> α_t."""
        k = len(self.names)
        # α_{t-1} ⊙ exp(ηλ) normalized, computed in log space (softmax) so a large ηλ cannot overflow.
        logits = torch.log(self.alpha) + self.step_size * excess.to(torch.float64).cpu()
        alpha = (1 - self.smoothing) * torch.softmax(logits, dim=0) + self.smoothing / k
        self.alpha = alpha
        self.total += alpha
        self.steps += 1
        return alpha

    def average(self) -> torch.Tensor:
        """ᾱ: the mean of α_1..α_t (uniform before any step)."""
        return self.total / self.steps if self.steps else torch.full_like(self.alpha, 1.0 / len(self.names))

    def state_dict(self) -> dict[str, Any]:
        return {"names": self.names, "alpha": self.alpha.tolist(), "total": self.total.tolist(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["names"]) != self.names:
            raise ValueError(f"the checkpoint's DoReMi domains are {state['names']}, this run's {self.names}; resume "
                             "with the same data.sources")
        self.alpha = torch.tensor(state["alpha"], dtype=torch.float64)
        self.total = torch.tensor(state["total"], dtype=torch.float64)
        self.steps = int(state["steps"])

    def to_json(self) -> dict[str, Any]:
        """What doremi_weights.json holds: ᾱ by name (`weights`, what data.weights_from reads), α_t, and η, c, t."""
        return {
            "weights": dict(zip(self.names, self.average().tolist(), strict=True)),
            "last": dict(zip(self.names, self.alpha.tolist(), strict=True)),
            "steps": self.steps, "step_size": self.step_size, "smoothing": self.smoothing,
        }


@dataclass
class DomainStats:
    """Sums over one global batch, per domain: clipped excess loss, proxy and reference token
    losses, and label tokens ([4, k] float64 in that order)."""

    sums: torch.Tensor

    @property
    def tokens(self) -> torch.Tensor:
        return self.sums[3]

    def mean(self, row: int) -> torch.Tensor:
        """Row `row` per token of its domain (0 for a domain absent from the batch)."""
        return self.sums[row] / self.tokens.clamp(min=1)


def domain_sums(values: torch.Tensor, domains: torch.Tensor, k: int) -> torch.Tensor:
    """Σ of `values` [b, s] over the tokens of each domain (`domains` [b]) -> [k]."""
    out = torch.zeros(k, dtype=torch.float64, device=values.device)
    return out.index_add_(0, domains.to(values.device), values.to(torch.float64).sum(-1))


def token_losses(job: TrainingJob, model: nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy [b, s] of `model` on `mb` (fp32; 0 where the label is ignored) and
    the label mask; inside train/step.py's step_context."""
    inputs = mb.inputs.to(job.device, non_blocking=True)
    labels = mb.labels.to(job.device, non_blocking=True)
    kwargs: dict[str, Any] = {}
    if job.block_masks is not None:
        kwargs["block_mask"] = job.block_masks(inputs)
    logits = model(inputs, **kwargs)
    loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
    return loss.view(labels.shape), labels != IGNORE_INDEX


class DoReMi(JobExtension):
    """A proxy run's DoReMi state: the reference model (under the job's plan), the domain weights
    and the last step's per-domain statistics (for metrics)."""

    name = "doremi"

    def __init__(self, job: TrainingJob, reference: nn.Module, weights: DomainWeights) -> None:
        self.job = job
        self.reference = reference
        self.weights = weights
        self.last: DomainStats | None = None

    def forward_backward(self, microbatches: Sequence[MicroBatch], observer: Any) -> torch.Tensor:
        return forward_backward(self.job, self, microbatches)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"doremi": self.weights}

    def write_records(self, folder: Path, final: bool) -> None:
        """doremi_weights.json (the weights so far survive a run cut short); at the end, where it is."""
        path = self.write(folder)
        if final:
            logger.info("DoReMi domain weights (average over %d steps) in %s: %s; train on them with "
                        "--data.weights_from %s", self.weights.steps, path,
                        ", ".join(f"{k} {v:.3f}" for k, v in self.weights.to_json()["weights"].items()), path)

    def metrics(self) -> dict[str, float]:
        """The last step's per-domain losses, excess losses and weights, and the running average ᾱ."""
        if self.last is None:
            return {}
        out: dict[str, float] = {}
        rows = {"domain_loss": 1, "reference_loss": 2, "excess_loss": 0}
        for i, name in enumerate(self.weights.names):
            for key, row in rows.items():
                out[f"{key}/{name}"] = float(self.last.mean(row)[i])
            out[f"domain_weight/{name}"] = float(self.weights.alpha[i])
            out[f"domain_weight_avg/{name}"] = float(self.weights.average()[i])
        return out

    def write(self, folder: str | Path) -> Path:
        """doremi_weights.json in `folder` (atomically: a run cut while writing keeps the last one)."""
        path = Path(folder) / WEIGHTS_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.weights.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def forward_backward(job: TrainingJob, doremi: DoReMi, microbatches: Sequence[MicroBatch]) -> torch.Tensor:
    """A DoReMi proxy step's forward and backward (module docstring): returns this rank's share of
    the step's mean (unweighted) proxy loss, as train/step.py's forward_backward does."""
    model, applied = job.model, job.applied
    k = len(doremi.weights.names)
    if any(mb.domains is None for mb in microbatches):
        raise RuntimeError("a DoReMi proxy step needs each sequence's domain (MicroBatch.domains); "
                           "kenotron's blend gives them, a custom data.loader does not")
    sums = torch.zeros(4, k, dtype=torch.float64, device=job.device)
    with torch.no_grad(), step_context(job):
        for mb in microbatches:
            proxy, mask = token_losses(job, model, mb)
            reference, _ = token_losses(job, doremi.reference, mb)
            excess = (proxy - reference).clamp(min=0) * mask  # clipped token by token, as in the paper
            for row, values in enumerate((excess, proxy, reference, mask)):
                sums[row] += domain_sums(values, mb.domains, k)
    local_loss = sums[1].sum() / (job.run.global_batch_size * microbatches[0].labels.shape[-1])
    group = job.meshes.get("dp_cp")
    if group is not None:
        dist.all_reduce(sums, group=group.get_group())
    stats = DomainStats(sums.cpu())
    alpha = doremi.weights.update(stats.mean(0))
    doremi.last = stats
    # Σ_i α_i · (token loss of domain i) / (tokens of domain i): each token weighs α of its domain
    # over that domain's token count in the global batch.
    per_token = (alpha / stats.tokens.clamp(min=1)).to(device=job.device, dtype=torch.float32)
    n = len(microbatches)
    for i, mb in enumerate(microbatches):
        applied.data_parallel.set_microstep(model, is_last=i == n - 1)
        with step_context(job):
            losses, _ = token_losses(job, model, mb)
            weighted = (losses.sum(-1) * per_token[mb.domains.to(job.device)]).sum()
            # Data parallel averages gradients over ranks; the objective wants their sum.
            (weighted * applied.data_parallel.averaging_size).backward()
    return local_loss.to(torch.float32)


def build_doremi(job: TrainingJob, reference: nn.Module) -> DoReMi:
    """The job's DoReMi state around its (already parallelized) reference model."""
    cfg = job.run.cfg
    reference.requires_grad_(False)
    reference.eval()
    names = [s.name for s in source_specs(cfg)]
    return DoReMi(job, reference, DomainWeights(names, cfg.doremi.step_size, cfg.doremi.smoothing))


def load_reference(doremi: DoReMi, reference: str) -> None:
    """The reference model's weights from `reference` (doremi.reference; every rank: DCP reshards to this layout)."""
    path = Path(reference)
    CheckpointManager(Checkpoint(), path.parent, model_parts=[doremi.reference]).load_from(path)
