"""Pipeline parallel: which modules each stage holds (as data), and the stages as modules.

A model is cut into *units* in forward order: the modules before the blocks (the embedding),
each block (`layers.0`, `layers.1`, ...), and the modules after them (final norm, output).
A `PipelineSplit` lists, for every stage, the unit FQNs it holds, the schedule that runs the
stages and the number of microbatches. It is plain data: built without a process group,
printed, compared, edited; `Plan.apply` uses it to cut the model before any other transform.

Stages and ranks: with `pp` ranks and S stages, single-stage schedules (GPipe, 1F1B) need
S = pp; looped schedules (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) put stage s on
rank s mod pp; V schedules (ZBVZeroBubble, DualPipeV) need S = 2 pp and put stages r and
2 pp - 1 - r on rank r, so rank 0 holds both the first and the last stage.

The automatic split balances a cost per stage: one per block, plus `first_stage_weight` on
the stage holding the embedding and `last_stage_weight` on the one holding norm and output
(both in units of one block). Every stage gets at least one block.

A model may ask for two things (DeepSeek-V3's multi-token-prediction modules do): its last
`pipeline_tail_blocks` blocks on the last stage (beside the output head they read), and, through
`pipeline_copies(units)`, a copy of an edge unit on a stage that holds `units` (the embedding
beside those modules). A copy keeps the original's parameter names, so checkpoints, optimizer
groups and init see one tensor; pipeline_tied.py keeps the copies equal, as tied weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineSchedule, get_schedule_class

from kenotron.degrees import ParallelConfigError
from kenotron.parallel.context.apply import SequenceSharder

SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
LOOPED_SCHEDULES = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
PP_SCHEDULES = SINGLE_STAGE_SCHEDULES + LOOPED_SCHEDULES + V_SCHEDULES


def pipeline_units(model: nn.Module, blocks: str = "layers.*") -> tuple[list[str], list[str], list[str]]:
    """(units before the blocks, block FQNs, units after the blocks), each in forward order.

    `blocks` is the plan's block pattern (`container.*`); the model's top-level children other
    than that container are the edge units. Children set to None are skipped.
    """
    container = blocks.split(".")[0]
    before: list[str] = []
    block_names: list[str] = []
    after: list[str] = []
    for name, child in model.named_children():
        if name == container:
            block_names = [f"{name}.{key}" for key, _ in child.named_children()]
        elif child is not None:
            (after if block_names else before).append(name)
    return before, block_names, after


def balanced_layer_counts(n_layers: int, n_stages: int, first_weight: float, last_weight: float) -> list[int]:
    """Blocks per stage minimizing the largest stage cost (blocks + edge weights), each >= 1.

    Water-filling: every further block goes to the cheapest stage. Ties go to the stage
    farthest from both ends, then to the later one: under 1F1B the first stage keeps the most
    microbatches' activations in flight, and the last one holds the logits.
    """
    if n_layers < n_stages:
        raise ParallelConfigError(
            f"{n_stages} pipeline stages but the model has only {n_layers} layers; every stage needs at "
            f"least one layer: lower parallelism.pp or parallelism.pp_stages_per_rank (at most {n_layers} stages)"
        )
    counts = [1] * n_stages
    extra = [0.0] * n_stages
    extra[0] += first_weight
    extra[-1] += last_weight
    for _ in range(n_layers - n_stages):
        cheapest = min(range(n_stages), key=lambda s: (counts[s] + extra[s], -min(s, n_stages - 1 - s), -s))
        counts[cheapest] += 1
    return counts


def _ranges(names: list[str]) -> str:
    """`layers.0 layers.1 layers.2 norm` -> `layers.0-2, norm` (for printing)."""
    out: list[str] = []
    i = 0
    while i < len(names):
        head, _, tail = names[i].rpartition(".")
        j = i
        if tail.isdigit():
            while j + 1 < len(names) and names[j + 1] == f"{head}.{int(tail) + j + 1 - i}":
                j += 1
        out.append(names[i] if j == i else f"{names[i]}-{names[j].rpartition('.')[2]}")
        i = j + 1
    return ", ".join(out)


@dataclass
class PipelineSplit:
    """How a model is cut into pipeline stages and how the stages are scheduled."""

    stages: list[list[str]]
    """Unit FQNs per stage, in forward order (e.g. [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]])."""
    pp: int
    """Pipeline ranks (the pp degree)."""
    schedule: str = "1F1B"
    """torch.distributed.pipelining schedule: one of PP_SCHEDULES."""
    microbatches: int = 1
    """Microbatches each schedule step splits the local batch into."""
    tied_parameters: list[list[str]] = field(default_factory=list)
    """Groups of parameter FQNs that are one tensor in the whole model (tied embeddings, copied
    units) but lie on different stages: kept equal by summing their gradients."""
    copies: dict[int, list[str]] = field(default_factory=dict)
    """{stage: edge units it holds a copy of}, besides its own units (the model's `pipeline_copies`)."""

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def rank_of_stage(self, stage: int) -> int:
        """The pp rank that runs `stage` (V schedules fold the stages back; others loop)."""
        if self.schedule in V_SCHEDULES and stage >= self.pp:
            return 2 * self.pp - 1 - stage
        return stage % self.pp

    def local_stages(self, pp_rank: int) -> list[int]:
        """Stage indices held by pp rank `pp_rank`, ascending."""
        return [s for s in range(self.n_stages) if self.rank_of_stage(s) == pp_rank]

    def units_of(self, stage: int) -> list[str]:
        """The units stage `stage` is cut with: its own, then its copies."""
        return self.stages[stage] + self.copies.get(stage, [])

    def holders(self, fqns: list[str]) -> list[int]:
        """The stages holding any of `fqns` (units or parameter names), originals and copies."""
        return [s for s in range(self.n_stages)
                if any(f == u or f.startswith(u + ".") for f in fqns for u in self.units_of(s))]

    def stage_of(self, fqn: str) -> int | None:
        """The stage holding the unit that contains `fqn` (a unit or a parameter name)."""
        for s, units in enumerate(self.stages):
            if any(fqn == u or fqn.startswith(u + ".") for u in units):
                return s
        return None

    def check(self, model: nn.Module, blocks: str = "layers.*") -> None:
        """The stages cover the model's units once each, in forward order; schedule and stage count fit."""
        before, block_names, after = pipeline_units(model, blocks)
        units = before + block_names + after
        flat = [u for stage in self.stages for u in stage]
        unknown = [u for u in flat if u not in units]
        if unknown:
            raise ParallelConfigError(
                f"pipeline stage module {unknown[0]!r} is not a unit of the model; units are "
                f"{_ranges(units)} (blocks are named one by one, e.g. layers.0)"
            )
        empty = [s for s, stage in enumerate(self.stages) if not stage]
        if empty:
            raise ParallelConfigError(f"pipeline stage {empty[0]} holds no module; give every stage at least one")
        if flat != units:
            missing = [u for u in units if u not in flat]
            what = f"misses {missing[0]!r}" if missing else "names a module twice or out of forward order"
            raise ParallelConfigError(
                f"the pipeline stages must list every unit once, in forward order ({_ranges(units)}); "
                f"this split {what}"
            )
        check_stage_count(self.schedule, self.n_stages, self.pp)

    def __str__(self) -> str:
        lines = [f"pipeline: {self.schedule}, {self.n_stages} stages on {self.pp} ranks, {self.microbatches} microbatches"]
        for s, units in enumerate(self.stages):
            lines.append(f"    stage {s} (pp rank {self.rank_of_stage(s)}): {_ranges(units)}")
        for s, units in sorted(self.copies.items()):
            lines.append(f"    stage {s} also holds a copy of {', '.join(units)} (kept equal)")
        for group in self.tied_parameters:
            lines.append(f"    tied across stages: {' = '.join(group)} (gradients summed)")
        return "\n".join(lines)


def default_stages_per_rank(schedule: str) -> int:
    return 1 if schedule in SINGLE_STAGE_SCHEDULES else 2


def check_stage_count(schedule: str, n_stages: int, pp: int) -> None:
    """The number of stages each schedule can run on `pp` ranks."""
    if schedule not in PP_SCHEDULES:
        raise ParallelConfigError(f"parallelism.pp_schedule={schedule!r} is not one of {', '.join(PP_SCHEDULES)}")
    if schedule in SINGLE_STAGE_SCHEDULES and n_stages != pp:
        raise ParallelConfigError(
            f"{schedule} runs one stage per rank, so {pp} stages for pp={pp}, but the split has {n_stages}; "
            f"give {pp} stages (pp_stages_per_rank=1, {pp} entries in pp_layers_per_stage / pp_stage_modules) or "
            f"pick a looped schedule ({', '.join(LOOPED_SCHEDULES)})"
        )
    if schedule in V_SCHEDULES and n_stages != 2 * pp:
        odd = " (an odd count cannot fold into a V)" if n_stages % 2 else ""
        raise ParallelConfigError(
            f"{schedule} places stages in a V, exactly 2 per rank: {2 * pp} stages for pp={pp}, but the split "
            f"has {n_stages}{odd}; give {2 * pp} stages (parallelism.pp_stages_per_rank=2, or {2 * pp} entries in "
            f"pp_layers_per_stage / pp_stage_modules)"
        )
    if n_stages % pp != 0:
        raise ParallelConfigError(
            f"{n_stages} stages do not spread evenly over pp={pp} ranks; use a multiple of {pp}"
        )


def check_microbatches(schedule: str, microbatches: int, local_batch_size: int, n_stages: int, pp: int) -> None:
    """Microbatches must divide the local batch and satisfy the schedule's own rule."""
    if microbatches < 1 or local_batch_size % microbatches != 0:
        divisors = [d for d in range(1, local_batch_size + 1) if local_batch_size % d == 0]
        raise ParallelConfigError(
            f"parallelism.pp_microbatches={microbatches} does not divide training.local_batch_size="
            f"{local_batch_size} (the batch each schedule step splits); use one of {divisors}"
        )
    need = {"1F1B": pp, "DualPipeV": n_stages}.get(schedule, 1)
    if microbatches < need:
        raise ParallelConfigError(
            f"{schedule} needs at least {need} microbatches (one per stage), got parallelism.pp_microbatches="
            f"{microbatches}; raise it (and training.local_batch_size, which it must divide)"
        )
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, microbatches // pp)
        if microbatches % rounds != 0:
            raise ParallelConfigError(
                f"{schedule} runs microbatches in rounds of pp={pp}: {microbatches} microbatches is not a multiple "
                f"of its {rounds} rounds; use at most {pp} or a multiple of {pp}"
            )




def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names of each parameter registered under several names (tied weights), in model order."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def stage_copies(model: nn.Module, stages: list[list[str]]) -> dict[int, list[str]]:
    """{stage: edge units the model asks a copy of on it} (its `pipeline_copies`, if any)."""
    ask = getattr(model, "pipeline_copies", None)
    if ask is None:
        return {}
    return {s: copies for s, units in enumerate(stages) if (copies := list(ask(units)))}


def cross_stage_ties(model: nn.Module, split: PipelineSplit) -> list[list[str]]:
    """The split's groups of one tensor on several stages: tied weights, and each parameter of a
    copied unit (a group of its one name, or the tied group it belongs to)."""
    groups = tied_groups(model)
    grouped = {name for group in groups for name in group}
    copied = {unit for units in split.copies.values() for unit in units}
    for name, _ in model.named_parameters():
        if name not in grouped and any(name.startswith(unit + ".") for unit in copied):
            groups.append([name])
    return [group for group in groups if len(split.holders(group)) > 1]


def build_pipeline_split(
    model: nn.Module,
    *,
    pp: int,
    schedule: str,
    local_batch_size: int,
    microbatches: int = 0,
    stages_per_rank: int = 0,
    layers_per_stage: list[int] | None = None,
    stage_modules: list[list[str]] | None = None,
    first_stage_weight: float = 1.0,
    last_stage_weight: float = 1.0,
    blocks: str = "layers.*",
) -> PipelineSplit:
    """A checked split of `model` (meta device is fine) from config-level choices.

    Precedence: explicit `stage_modules`, else explicit `layers_per_stage`, else a balanced
    split into pp x stages_per_rank stages (0 = the schedule's default: 1 or 2).
    `microbatches` 0 means one sequence per microbatch (local_batch_size of them).
    """
    before, block_names, after = pipeline_units(model, blocks)
    if stage_modules:
        stages = [list(s) for s in stage_modules]
    else:
        if layers_per_stage:
            counts = list(layers_per_stage)
            if any(c < 1 for c in counts) or sum(counts) != len(block_names):
                raise ParallelConfigError(
                    f"parallelism.pp_layers_per_stage={counts} must give every stage >= 1 layer and add up to the "
                    f"model's {len(block_names)} layers"
                )
        else:
            per_rank = stages_per_rank or default_stages_per_rank(schedule)
            # Tail blocks go to the last stage; they weigh there as blocks.
            tail = getattr(model, "pipeline_tail_blocks", 0)
            counts = balanced_layer_counts(len(block_names) - tail, pp * per_rank, first_stage_weight,
                                           last_stage_weight + tail)
            counts[-1] += tail
        stages, start = [], 0
        for count in counts:
            stages.append(block_names[start : start + count])
            start += count
        stages[0] = before + stages[0]
        stages[-1] = stages[-1] + after
    split = PipelineSplit(stages, pp, schedule, microbatches or local_batch_size)
    split.check(model, blocks)
    check_microbatches(schedule, split.microbatches, local_batch_size, split.n_stages, pp)
    split.copies = stage_copies(model, split.stages)
    split.tied_parameters = cross_stage_ties(model, split)
    return split


def stage_module(model: nn.Module, units: list[str], blocks: str = "layers.*") -> nn.Module:
    """A copy of `model` that keeps only `units` (the rest deleted or set to None).

    Parameter names stay those of the whole model (`layers.5.attention.wq.weight`), so a
    stage's state dict is a slice of the model's. Build it on the meta device: the copy is then
    free, and init_weights seeds each parameter by name, giving the whole model's values.
    """
    part = copy.deepcopy(model)
    keep = set(units)
    container = blocks.split(".")[0]
    for name, child in list(part.named_children()):
        if name == container:
            for key in [k for k, _ in child.named_children()]:
                if f"{name}.{key}" not in keep:
                    del child[key]
        elif child is not None and name not in keep:
            setattr(part, name, None)
    return part


def feed_positions(part: nn.Module, tokens_per_row: int, sharder: SequenceSharder | None) -> None:
    """Give a stage the RoPE positions of the tokens it holds (a forward pre-hook).

    The model numbers its input's positions 0..n-1 unless it is given `positions`. Inside a
    pipeline the schedule hands a stage one tensor only (token ids on the first stage, the
    hidden state on the others), and two things make that numbering wrong:

    - sequence parallel splits the hidden state a later stage receives, (batch, seq / tp,
      dim): `tokens_per_row` = tp restores the stage's sequence length;
    - context parallel gives this rank a shard of every sequence whose tokens sit at
      scattered global positions (the head-tail layout): `sharder` gives them, on every stage.
    """
    def add_positions(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get("positions") is None:
            x = args[0]
            local = x.shape[1] * tokens_per_row
            if sharder is None:
                positions = torch.arange(local, device=x.device)
            else:
                positions = sharder.layout(local * sharder.cp).positions(sharder.rank, device=x.device)
            kwargs = {**kwargs, "positions": positions}
        return args, kwargs

    part.register_forward_pre_hook(add_positions, with_kwargs=True)


def build_schedule(
    split: PipelineSplit,
    parts: list[nn.Module],
    stage_ids: list[int],
    group: dist.ProcessGroup,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> _PipelineSchedule:
    """The torch.distributed.pipelining schedule running this rank's `parts` (stages `stage_ids`).

    `loss_fn(output, target)` is called once per microbatch on the last stage; its value is
    back-propagated as it is (scale_grads=False), so it must carry the whole normalization.
    """
    stages = [
        PipelineStage(part, stage, split.n_stages, device, group=group)
        for part, stage in zip(parts, stage_ids)
    ]
    schedule_cls = get_schedule_class(split.schedule)
    first = stages[0] if split.schedule in SINGLE_STAGE_SCHEDULES else stages
    return schedule_cls(first, split.microbatches, loss_fn=loss_fn, scale_grads=False)
