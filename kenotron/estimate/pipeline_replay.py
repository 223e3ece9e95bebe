"""The pipeline schedule of one rank replayed on fake tensors, in the schedule's order.

The job is the trainer's (`build_job`: `plan.apply` cuts this rank's stages out of a meta
model and applies TP/SP, AC and FSDP to each; one optimizer per stage; tied weights through
`TiedAcrossStages`); `SimulatedPipeline` is its PipelineExecutor in place of torch's schedule
(kenotron/train/pipeline_step.py), so the shared step (kenotron/train/step.py) clips and
steps it as the trainer does. It replays the rank's actions (pipeline_order.py) with the
bookkeeping of torch's `PipelineStage`, which is what holds memory between actions:

- a forward keeps the stage's output and inputs (`fwd_cache`) until the microbatch's
  backward, and the last stage its loss graph until the backward; with `return_outputs`
  (torch's default, not the trainer's: see kenotron/train/pipeline_step.py) the last stage
  also keeps every output (`output_chunks`: a microbatch's logits) until the next schedule
  step and concatenates them when the step ends;
- a stage that does not hold the first stage receives its inputs, and one that does not hold
  the last stage its output gradients, into buffers allocated once per microbatch; between
  two stages of the same rank (V schedules) the tensors are handed over instead, and they
  stay referenced by the next stage until the next step, as in torch;
- the backward passes (full, input-only, weight-only) and the gradient reduction are torch's
  own functions (`backward_maybe_with_nosync`, `perform_reduce_grad`), so FSDP's flags
  (keep gathered, no gradient sync until the schedule's end) are set exactly as torch does.

What torch's point-to-point messages do is replaced: a received activation is the fake
buffer itself, a received gradient the fake gradient buffer, and a sent tensor is dropped
once the action ends (torch may hold it until the send completes).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

# Imported here, not under a FakeTensorMode: microbatch.py makes a tensor when it is first imported.
from torch.distributed.pipelining.microbatch import merge_chunks
from torch.distributed.pipelining.stage import _PipelineStageBase

from kenotron.estimate.breakdown import Position
from kenotron.estimate.pipeline_order import Action
from kenotron.estimate.tracker import StepMemoryTracker
from kenotron.parallel.model_layout import matching_modules
from kenotron.parallel.pipeline import PipelineSplit, cross_stage_ties, pipeline_units, stage_copies
from kenotron.parallel.pipeline_tied import TiedAcrossStages
from kenotron.parallel.plan import AppliedPlan
from kenotron.train.pipeline_step import RETURN_OUTPUTS
from kenotron.train.resolve import ResolvedRun
from kenotron.train.step import extension_inputs, microbatch_loss, step_context
from kenotron.train.training_job import TrainingJob


def stage_block_counts(split: PipelineSplit, blocks: str = "layers.*") -> list[int]:
    container = blocks.split(".")[0]
    return [sum(u.startswith(container + ".") for u in units) for units in split.stages]


def resized_split(run: ResolvedRun, counts: list[int]) -> tuple[ResolvedRun, PipelineSplit]:
    """The run with a model of sum(counts) blocks cut into stages of `counts` blocks; every
    stage keeps the edge modules (embedding, norm, output) the configured split gives it."""
    split, blocks = run.plan.pipeline, run.plan.layout.blocks
    assert split is not None
    args = dataclasses.replace(run.model_args, n_layers=sum(counts))
    with torch.device("meta"):
        model = run.spec.build(args)
    before, block_names, after = pipeline_units(model, blocks)
    stages, start = [], 0
    for units, count in zip(split.stages, counts):
        edges_before = [u for u in units if u in before]
        edges_after = [u for u in units if u in after]
        stages.append(edges_before + block_names[start : start + count] + edges_after)
        start += count
    new = PipelineSplit(stages, split.pp, split.schedule, split.microbatches)
    new.check(model, blocks)
    new.copies = stage_copies(model, new.stages)
    new.tied_parameters = cross_stage_ties(model, new)
    plan = dataclasses.replace(run.plan.copy(), pipeline=new)
    return dataclasses.replace(run, model_args=args, plan=plan), new


def with_microbatches(run: ResolvedRun, microbatches: int) -> ResolvedRun:
    """The run with `microbatches` microbatches of the same size per schedule step."""
    split = run.plan.pipeline
    assert split is not None
    size = run.cfg.training.local_batch_size // split.microbatches
    training = dataclasses.replace(run.cfg.training, local_batch_size=size * microbatches)
    plan = dataclasses.replace(run.plan.copy(), pipeline=dataclasses.replace(split, microbatches=microbatches))
    return dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, training=training), plan=plan)


@dataclass
class SimStage:
    """What torch's PipelineStage holds for one stage, on fake tensors."""

    index: int
    module: nn.Module
    is_first: bool
    is_last: bool
    blocks: list[nn.Module]
    act_buffers: list[torch.Tensor] = field(default_factory=list)
    """Forward inputs, one per microbatch (not on the first stage)."""
    grad_buffers: list[torch.Tensor] = field(default_factory=list)
    """Output gradients, one per microbatch (not on the last stage)."""
    fwd_cache: dict[int, tuple[tuple[Any, ...], list[Any]]] = field(default_factory=dict)
    backward_state: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    output_chunks: list[Any] = field(default_factory=list)

    def clear_runtime_states(self) -> None:
        self.fwd_cache.clear()
        self.backward_state.clear()
        self.losses.clear()
        self.output_chunks.clear()


def residual_meta(run: ResolvedRun, applied: AppliedPlan) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of the hidden state passed between stages (a plain local tensor: the
    blocks' TP styles hand back local outputs): bf16 when data parallel casts the parameters,
    fp32 under autocast (the fp32 embedding output keeps the residual stream fp32) or fp32 training."""
    t, split = run.cfg.training, applied.plan.pipeline
    assert split is not None
    seq = t.seq_len // run.dims.cp  # context parallel: this rank's share of every sequence
    if applied.plan._sequence_sharded(applied.meshes):
        seq //= applied.meshes.size("tp")
    bf16 = t.param_dtype == "bfloat16" and applied.data_parallel.casts_params
    return (t.local_batch_size // split.microbatches, seq, run.model_args.dim), torch.bfloat16 if bf16 else torch.float32


class SimulatedPipeline:
    """The estimator's PipelineExecutor: this rank's schedule replayed on fake tensors.

    `actions` and `numbering` are the order one schedule step runs (set by the caller: the
    warm-up's or the schedule's); `forward_backward` runs them once per micro-step."""

    def __init__(self, job: TrainingJob, fake_mode: Any) -> None:
        self.job = job
        applied = job.applied
        split = applied.plan.pipeline
        assert split is not None
        self.split = split
        # Outside the fake mode: it creates process groups.
        self.tied = TiedAcrossStages(split, applied.model_parts, applied.stage_ids, applied.meshes)
        shape, dtype = residual_meta(job.run, applied)
        n = split.microbatches
        self.stages: dict[int, SimStage] = {}
        with fake_mode:
            for index, part in zip(applied.stage_ids, applied.model_parts):
                stage = SimStage(index, part, index == 0, index == split.n_stages - 1,
                                 [m for _, m in matching_modules(part, applied.plan.layout.blocks)])
                # Allocated once when torch sets the stage up, one per microbatch, kept across steps.
                if not stage.is_first:
                    stage.act_buffers = [torch.empty(shape, dtype=dtype, device=job.device) for _ in range(n)]
                if not stage.is_last:
                    stage.grad_buffers = [torch.empty(shape, dtype=dtype, device=job.device) for _ in range(n)]
                self.stages[index] = stage
        self.actions: list[Action] = []
        self.numbering = Numbering((), n, 0)

    def receive_buffers(self) -> list[torch.Tensor]:
        return [t for s in self.stages.values() for t in s.act_buffers + s.grad_buffers]

    def forward_backward(self, microbatches: Sequence[Any], observer: Any) -> torch.Tensor:
        """PipelineRunner.forward_backward: one schedule step per micro-step, then tied gradients."""
        steps = len(microbatches)
        for i in range(steps):
            for part in self.job.model_parts:
                self.job.applied.data_parallel.set_microstep(part, is_last=i == steps - 1)
            run_actions(self, self.actions, self.numbering, i, observer)
        self.tied.sum_gradients_()
        return torch.zeros((), device=self.job.device)

    def norm_duplicates(self) -> set[int]:
        return self.tied.norm_duplicates()


@dataclass(frozen=True)
class Numbering:
    """Position numbers (the tracker's micro_step field) of a rank's actions.

    A microbatch's forward and its (full or input) backward share a number, as the tracker's
    gradient hooks label backward positions with the forward's; weight passes, the other
    actions and the final merge get numbers of their own. Identical for every depth, so
    positions of shallow and deep runs correspond.
    """

    local_stages: tuple[int, ...]
    microbatches: int
    n_actions: int

    @property
    def per_micro_step(self) -> int:
        return 2 * len(self.local_stages) * self.microbatches + self.n_actions + 1

    def of(self, micro_step: int, action: Action, index: int) -> int:
        base = micro_step * self.per_micro_step
        pair = self.local_stages.index(action.stage) * self.microbatches + (action.microbatch or 0)
        if action.kind in ("F", "B", "I"):
            return base + pair
        if action.kind == "W":
            return base + len(self.local_stages) * self.microbatches + pair
        return base + 2 * len(self.local_stages) * self.microbatches + index

    def merge(self, micro_step: int) -> int:
        return micro_step * self.per_micro_step + self.per_micro_step - 1

    def decode(self, number: int, actions: list[Action]) -> tuple[int, str, Action | None]:
        """(micro-step, what, action): what is "pair", "weight", "action" or "merge"."""
        micro_step, rest = divmod(number, self.per_micro_step)
        pairs = len(self.local_stages) * self.microbatches
        if rest == self.per_micro_step - 1:
            return micro_step, "merge", None
        if rest >= 2 * pairs:
            return micro_step, "action", actions[rest - 2 * pairs]
        what = "pair" if rest < pairs else "weight"
        local, mb = divmod(rest % pairs, self.microbatches)
        return micro_step, what, Action("F" if what == "pair" else "W", self.local_stages[local], mb)


def _torch_stage(module: nn.Module) -> Any:
    """What torch's stage methods used here read from `self`."""
    return SimpleNamespace(submod=module, scale_grads=lambda factor: None)


def _backward(stage: SimStage, kind: str, kwargs: dict[str, Any], last_backward: bool) -> tuple[Any, Any]:
    return _PipelineStageBase.backward_maybe_with_nosync(_torch_stage(stage.module), kind, kwargs, last_backward)


def _reduce_grad(stage: SimStage) -> None:
    """The gradient reduction a schedule runs after a stage's last backward (FSDP's post-backward;
    `_post_backward` in torch releases before `perform_reduce_grad`)."""
    reduce = getattr(_PipelineStageBase, "perform_reduce_grad", None) or _PipelineStageBase._post_backward
    reduce(_torch_stage(stage.module), 1)


def _for_fsdp(module: nn.Module, fn) -> None:
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            fn(sub)


def run_actions(pipe: SimulatedPipeline, actions: list[Action], numbering: Numbering, micro_step: int,
                observer: Any, return_outputs: bool | None = None) -> None:
    """One schedule step (torch's `schedule.step`) of this rank's actions; `return_outputs` as
    the trainer passes it to `step()` (True: the last stage keeps and merges its outputs;
    None: the trainer's RETURN_OUTPUTS, read at each call)."""
    return_outputs = RETURN_OUTPUTS if return_outputs is None else return_outputs
    job = pipe.job
    stages, n = pipe.stages, pipe.split.microbatches
    for stage in stages.values():
        stage.clear_runtime_states()
    vocab = job.run.model_args.vocab_size
    params = [p for part in job.model_parts for p in part.parameters()]
    first = any(s.is_first for s in stages.values())
    last = any(s.is_last for s in stages.values())
    # The loader's batch copied to the device (under context parallel this rank's shard of it,
    # as PipelineRunner.rank_shard cuts it), split into microbatches (views) as step() splits it.
    tokens = _rank_batch(job, vocab).tensor_split(n) if first else None
    labels = _rank_batch(job, vocab).tensor_split(n) if last else None
    # The extensions' inputs (MTP's future tokens), which torch's step hands every local stage.
    extra = extension_inputs(job, _whole_batch(job, vocab)) if last else {}
    stage_kwargs = [{k: v.tensor_split(n)[m] for k, v in extra.items()} for m in range(n)]
    backward_count: Counter[int] = Counter()
    with step_context(job):
        for index, a in enumerate(actions):
            stage, m = stages[a.stage], a.microbatch
            number = numbering.of(micro_step, a, index)
            if a.kind == "F":
                observer.set_phase("forward", number)
                assert m is not None
                x = tokens[m] if stage.is_first else stage.act_buffers[m].requires_grad_(True)  # type: ignore[index]
                out = stage.module(x, **stage_kwargs[m])
                if stage.is_last:
                    if return_outputs:
                        stage.output_chunks.append(out)
                    stage.losses[m] = microbatch_loss(job, out, labels[m])  # type: ignore[index]
                stage.fwd_cache[m] = ((out,), [x])
                if a.stage + 1 in stages:  # V schedules: the next stage is on this rank
                    stages[a.stage + 1].act_buffers[m] = out.detach()
                del x, out
                observer.end_forward()
                continue
            observer.set_phase("backward", number)
            if a.kind in ("B", "I"):
                assert m is not None
                outputs, inputs = stage.fwd_cache.pop(m)
                stage_output: Any = stage.losses[m] if stage.is_last else outputs
                output_grads = None if stage.is_last else (stage.grad_buffers[m],)
                grads: tuple[Any, ...] = ()
                if a.kind == "B":
                    backward_count[a.stage] += 1
                    grads, _ = _backward(stage, "full", {"stage_output": stage_output, "output_grads": output_grads,
                                                         "input_values": inputs}, backward_count[a.stage] == n)
                else:
                    groups = None
                    if not stage.is_first:  # torch leaves the first stage's whole backward to its weight pass
                        if isinstance(stage_output, torch.Tensor):
                            stage_output = (stage_output,)
                        grads, groups = _backward(stage, "input", {"stage_output": stage_output,
                                                  "output_grads": output_grads, "input_values": inputs}, False)
                    stage.backward_state[m] = (inputs, groups, stage_output, output_grads)
                if a.stage - 1 in stages and grads:  # handed to the previous stage on this rank
                    stages[a.stage - 1].grad_buffers[m] = grads[0]
                if stage.is_last and not stage.is_first:  # torch frees the last stage's graph early
                    for o in outputs:
                        if not o._is_view():
                            o.detach_()
                del outputs, inputs, stage_output, output_grads, grads
            elif a.kind == "W":
                assert m is not None
                backward_count[a.stage] += 1
                inputs, groups, stage_output, output_grads = stage.backward_state.pop(m)
                last_backward = backward_count[a.stage] == n
                if a.stage != 0:
                    _backward(stage, "weight", {"stage_output": stage_output, "param_groups": groups}, last_backward)
                else:
                    _backward(stage, "full", {"stage_output": stage_output, "output_grads": output_grads,
                                              "input_values": inputs}, last_backward)
                del inputs, groups, stage_output, output_grads
            elif a.kind == "UNSHARD":
                _for_fsdp(stage.module, lambda mod: mod.unshard())
            elif a.kind == "RESHARD":
                _for_fsdp(stage.module, lambda mod: mod.reshard())
            elif a.kind == "REDUCE_GRAD":
                _reduce_grad(stage)
            observer.end_backward()
            observer.mark_gradients(params)
        for stage in stages.values():
            if stage.is_last and return_outputs:  # step() returns the outputs merged
                observer.set_phase("backward", numbering.merge(micro_step))
                merged = merge_chunks(stage.output_chunks, None)
                del merged
                observer.end_backward()


def _whole_batch(job: TrainingJob, vocab: int) -> torch.Tensor:
    """Random token ids of one micro-step's local batch, whole sequences."""
    t = job.run.cfg.training
    return torch.randint(0, vocab, (t.local_batch_size, t.seq_len))


def _rank_batch(job: TrainingJob, vocab: int) -> torch.Tensor:
    """Random token ids of one micro-step's local batch, as this rank holds them."""
    batch, sharder = _whole_batch(job, vocab), job.applied.sequence_sharder
    return batch if sharder is None else sharder.layout(batch.shape[1]).shard(batch, sharder.rank)


class StagesTracker(StepMemoryTracker):
    """The step tracker over several stage modules: blocks are numbered across the stages,
    and each stage's first and last block mark its own edges (the base class knows one model)."""

    def __init__(self, parts: list[nn.Module], stage_blocks: list[list[nn.Module]]) -> None:
        super().__init__(parts[0], [b for blocks in stage_blocks for b in blocks])
        self._parts = parts
        self._stage_blocks = stage_blocks

    def _install_hooks(self) -> None:
        for part in self._parts:
            for name, module in part.named_modules():
                self._hooks.append(module.register_forward_pre_hook(self._push(name)))
                self._hooks.append(module.register_forward_hook(self._pop, always_call=True))
        offset = 0
        for blocks in self._stage_blocks:
            for j, block in enumerate(blocks):
                self._hooks.append(block.register_forward_pre_hook(self._enter_stage_block(offset + j, j == 0)))
                self._hooks.append(block.register_forward_hook(self._leave_stage_block(offset + j, j == len(blocks) - 1)))
            offset += len(blocks)

    def _enter_stage_block(self, index: int, first: bool):
        def hook(_module, args):
            if self._position.phase != "forward":
                return
            micro = self._position.micro_step
            self._position = Position("forward", micro, index)
            if first:  # backward reaching the stage's input: the stage's "before" edge
                self._on_gradient(args, Position("backward", micro, None, "before"))

        return hook

    def _leave_stage_block(self, index: int, last: bool):
        def hook(_module, _args, output):
            if self._position.phase != "forward":
                return
            micro = self._position.micro_step
            if last:
                self._position = Position("forward", micro, None, "after")
            self._on_gradient(output, Position("backward", micro, index))

        return hook
