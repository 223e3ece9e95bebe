"""A job's parallel degrees and every check on them, before any process group or mesh exists.

Plain arithmetic on the config's numbers (no torch): the launcher checks a layout with it in
the time Python and the config take to import, and parallel/dims.py builds the job's
DeviceMesh from it.

Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp. Only degrees > 1
become mesh dimensions; flattened views are built for the groups the plans need:

- "dp"          = dp_replicate x dp_shard  (data loading: which slice of the global batch)
- "dp_shard_cp" = dp_shard x cp            (FSDP shards parameters over this)
- "dp_cp"       = dp_replicate x dp_shard x cp (the loss is averaged over this)
- "dp_cp_tp"    = every dimension but pp   (the ranks holding other tokens of one micro-batch)

Expert parallelism (ep > 1) borrows its ranks from dp_shard x cp: dp_shard is split into
"efsdp" (outer, dp_shard x cp / ep, kept even at size 1) and "dp_shard_in_ep" (ep / cp), and
"ep" = dp_shard_in_ep x cp is a flattened view. Each MoE layer's experts are sharded over ep and
FSDP-sharded over efsdp (x dp_replicate); "dp_shard" becomes the view efsdp x dp_shard_in_ep.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kenotron.errors import ConfigError


class ParallelConfigError(ConfigError):
    """Degrees that cannot be laid out on the world size or the model; the message says how to fix them."""


MESH_DIM_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
EP_MESH_DIM_ORDER = ("pp", "dp_replicate", "efsdp", "dp_shard_in_ep", "cp", "tp")
"""The physical dimensions under expert parallelism: dp_shard split in two."""
FLATTENED_DIMS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
    "dp_cp_tp": ("dp_replicate", "dp_shard", "cp", "tp"),
}
EP_FLATTENED_DIMS: dict[str, tuple[str, ...]] = {
    "dp_shard": ("efsdp", "dp_shard_in_ep"),
    "dp": ("dp_replicate", "efsdp", "dp_shard_in_ep"),
    "dp_shard_cp": ("efsdp", "dp_shard_in_ep", "cp"),
    "dp_cp": ("dp_replicate", "efsdp", "dp_shard_in_ep", "cp"),
    "dp_cp_tp": ("dp_replicate", "efsdp", "dp_shard_in_ep", "cp", "tp"),
    "ep": ("dp_shard_in_ep", "cp"),
}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ParallelDims:
    """Resolved parallel degrees of one job (dp_shard never -1 here)."""

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int

    @classmethod
    def from_degrees(
        cls,
        world_size: int,
        *,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
    ) -> ParallelDims:
        """Check the degrees against the world size, filling dp_shard=-1 with what is left."""
        named = {"dp_replicate": dp_replicate, "cp": cp, "tp": tp, "pp": pp, "ep": ep}
        for name, value in named.items():
            if value < 1:
                raise ParallelConfigError(f"parallelism.{name}={value} must be >= 1")
        if dp_shard == 0 or dp_shard < -1:
            raise ParallelConfigError(f"parallelism.dp_shard={dp_shard} must be >= 1, or -1 to fill the rest")
        others = dp_replicate * cp * tp * pp
        if dp_shard == -1:
            if world_size % others != 0:
                raise ParallelConfigError(
                    f"dp_shard=-1 has no room: dp_replicate x cp x tp x pp = {dp_replicate} x {cp} x {tp} x {pp} "
                    f"= {others} does not divide the world size {world_size}; choose degrees whose product "
                    f"divides {world_size} (divisors: {_divisors(world_size)})"
                )
            dp_shard = world_size // others
        if others * dp_shard != world_size:
            raise ParallelConfigError(
                f"parallel degrees multiply to {others * dp_shard} (dp_replicate {dp_replicate} x dp_shard "
                f"{dp_shard} x cp {cp} x tp {tp} x pp {pp}) but the world size is {world_size}; "
                f"set parallelism.dp_shard=-1 to fill the rest, or change the degrees"
            )
        if ep > 1 and ep not in expert_parallel_degrees(dp_shard, cp):
            raise ParallelConfigError(
                f"parallelism.ep={ep} cannot be taken from dp_shard x cp = {dp_shard} x {cp} (expert parallelism "
                f"borrows all {cp} context-parallel ranks and a divisor of dp_shard); use one of "
                f"{expert_parallel_degrees(dp_shard, cp)}"
            )
        return cls(dp_replicate, dp_shard, cp, tp, pp, ep, world_size)

    @property
    def efsdp(self) -> int:
        """Ranks the expert weights are FSDP-sharded over (besides dp_replicate): dp_shard x cp / ep."""
        return self.dp_shard * self.cp // self.ep

    @property
    def experts_outside_fsdp(self) -> bool:
        """Under expert parallelism without pipeline parallel, whether the experts' FSDP mesh
        (efsdp x dp_replicate) is one rank: the routed experts then stay outside FSDP
        (parallel/data_parallel.py's experts_outside_fsdp). Under pipeline parallel they stay FSDP
        units: there FSDP gathers them once a step, where outside it each microbatch would cast
        them again and keep its copy (slower and larger by the estimators: docs/parallelism.md)."""
        return self.ep > 1 and self.efsdp * self.dp_replicate == 1 and self.pp == 1

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different slices of the global batch are in flight."""
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> dict[str, int]:
        """The degrees of the mesh dimensions (pp, dp_replicate, dp_shard, cp, tp), plus ep when > 1."""
        out = {name: getattr(self, name) for name in MESH_DIM_ORDER}
        if self.ep > 1:
            out["ep"] = self.ep
        return out

    def mesh_shape(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, sizes) of the mesh dimensions with degree > 1 (and efsdp under ep), outermost first."""
        if self.ep > 1:
            sizes = {"pp": self.pp, "dp_replicate": self.dp_replicate, "efsdp": self.efsdp,
                     "dp_shard_in_ep": self.ep // self.cp, "cp": self.cp, "tp": self.tp}
            dims = [(n, sizes[n]) for n in EP_MESH_DIM_ORDER if sizes[n] > 1 or n == "efsdp"]
        else:
            dims = [(n, d) for n, d in self.degrees().items() if d > 1]
        return tuple(n for n, _ in dims), tuple(d for _, d in dims)

    @property
    def flattened_dims(self) -> dict[str, tuple[str, ...]]:
        return EP_FLATTENED_DIMS if self.ep > 1 else FLATTENED_DIMS

    def grad_accum_steps(self, global_batch_size: int, local_batch_size: int) -> int:
        """Micro-steps per optimizer step so that `global_batch_size` sequences are seen."""
        per_micro = local_batch_size * self.dp
        if global_batch_size % per_micro != 0:
            raise ParallelConfigError(
                f"training.global_batch_size={global_batch_size} is not divisible by local_batch_size x dp = "
                f"{local_batch_size} x {self.dp} = {per_micro}; use a multiple of {per_micro}"
            )
        return global_batch_size // per_micro

    def check_model(self, tp_divisors: Mapping[str, int], n_layers: int) -> None:
        """Tensor/pipeline degrees against the model's dimensions: `tp_divisors` ({name: size},
        the family's ModelSpec.tp_divisors) are what tensor parallel splits."""
        tp = self.tp
        for name, value in tp_divisors.items():
            if value % tp != 0:
                valid = [d for d in _divisors(value) if d <= max(value, 1)][:12]
                raise ParallelConfigError(f"tp={tp} does not divide {name}={value}; use one of {valid}")
        if self.pp > n_layers:
            raise ParallelConfigError(f"pp={self.pp} stages but the model has only {n_layers} layers; use pp <= {n_layers}")

    def check_seq_len(self, seq_len: int, sequence_parallel: bool = True, key: str = "training.seq_len") -> None:
        """Sequence parallel splits by tp, load-balanced context parallel by 2 x cp; `key` names
        the length in the message (a data stage's has its own)."""
        tp = self.tp if sequence_parallel else 1
        unit = tp * (2 * self.cp if self.cp > 1 else 1)
        if seq_len % unit != 0:
            what = f"tp x 2 x cp = {tp} x 2 x {self.cp} = {unit}" if self.cp > 1 else f"tp={tp}"
            raise ParallelConfigError(
                f"{key}={seq_len} is not divisible by {what} (sequence parallel splits each sequence "
                f"over the ranks); use a multiple of {unit}"
            )

    def __str__(self) -> str:
        degrees = " x ".join(f"{n} {d}" for n, d in self.degrees().items() if n != "ep")
        return f"ParallelDims(world {self.world_size}: {degrees}, ep {self.ep})"


def expert_parallel_degrees(dp_shard: int, cp: int, n_experts: int = 0) -> list[int]:
    """The ep degrees these ranks allow: 1, and cp x d for each divisor d of dp_shard (dividing
    `n_experts` when given)."""
    out = sorted({1} | {cp * d for d in _divisors(dp_shard)})
    return [e for e in out if not n_experts or n_experts % e == 0]


CP_SCHEMES = ("ring", "ulysses")
"""parallelism.cp_scheme: the ring (parallel/context/ring.py, torch_ring.py) or the all-to-all (ulysses.py)."""


def ulysses_head_problem(heads: int, kv_heads: int, cp: int) -> str:
    """Why `heads` query and `kv_heads` key/value heads of one tensor-parallel rank cannot be
    scattered over `cp` ranks by the all-to-all ("" when they can): the query heads must divide
    by cp; the kv heads too, or divide cp (each is then repeated over cp/kv_heads ranks)."""
    if heads % cp:
        return f"{heads} query heads per tensor-parallel rank do not divide by cp={cp}"
    if kv_heads % cp and cp % kv_heads:
        return (f"{kv_heads} key/value heads per tensor-parallel rank neither divide by cp={cp} nor divide it "
                f"(a kv head is repeated over cp/kv_heads ranks)")
    return ""


def ulysses_cp_degrees(heads: int, kv_heads: int, tp: int) -> list[int]:
    """The cp degrees the all-to-all spans whole at this tp: those `ulysses_head_problem` accepts."""
    per_rank, kv_per_rank = heads // tp, kv_heads // tp
    return [cp for cp in _divisors(per_rank) if not ulysses_head_problem(per_rank, kv_per_rank, cp)]


def ulysses_degree(heads: int, kv_heads: int, cp: int) -> int:
    """The all-to-all's degree under parallelism.cp_scheme='ulysses' for `heads` query and
    `kv_heads` key/value heads per tensor-parallel rank: the largest divisor u of cp over which
    they split (`ulysses_head_problem`); a ring spans the other cp / u (parallel/context/ulysses.py).
    u = cp: the all-to-all alone; u = 1: the heads share nothing with cp (refused)."""
    return max(u for u in _divisors(cp) if not ulysses_head_problem(heads, kv_heads, u))


def attention_heads(args: Any) -> tuple[int, int]:
    """A model's (query heads, key/value heads): without n_kv_heads (MLA) keys and values are per
    query head."""
    heads = args.n_heads
    return heads, getattr(args, "n_kv_heads", None) or heads


def model_ulysses_degree(args: Any, dims: ParallelDims) -> int:
    """`ulysses_degree` for a model's heads after tensor parallel, at the run's cp."""
    heads, kv_heads = attention_heads(args)
    return ulysses_degree(heads // dims.tp, kv_heads // dims.tp, dims.cp)


def check_ulysses_heads(dims: ParallelDims, heads: int, kv_heads: int) -> None:
    """parallelism.cp_scheme='ulysses' against the model's heads (after tensor parallel): the
    all-to-all needs a degree > 1 that divides cp (`ulysses_degree`)."""
    if dims.cp == 1:
        return
    # check_model ran first: tp divides both head counts.
    per_rank, kv_per_rank = heads // dims.tp, kv_heads // dims.tp
    if ulysses_degree(per_rank, kv_per_rank, dims.cp) == 1:
        problem = ulysses_head_problem(per_rank, kv_per_rank, dims.cp)
        usable = [u for u in ulysses_cp_degrees(heads, kv_heads, dims.tp) if u > 1]
        fix = (f"use a cp divisible by one of {usable} (the all-to-all spans the largest such divisor, a ring the rest)"
               if usable else "no all-to-all degree > 1 exists for these heads")
        raise ParallelConfigError(
            f"parallelism.cp_scheme='ulysses' scatters attention heads over the cp ranks, but with tp={dims.tp} "
            f"{problem}, and they split over no divisor > 1 of cp={dims.cp}; {fix}, or use "
            f"parallelism.cp_scheme='ring'"
        )


ZERO_BUBBLE_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""Pipeline schedules that split each backward into an input and a weight pass."""

def check_split_backward(schedule: str, ac_mode: str, moe: bool = False) -> None:
    """torch's selective activation checkpointing allows one backward per checkpointed region; a
    zero-bubble schedule's weight pass is a second one ("Trying to backward an extra time").
    `moe`: the model has routed experts, whose weights enter custom autograd functions (the
    grouped GEMMs and gathers): torch before 2.13 cannot start a weight pass from such a function's
    node (it reads `_input_metadata`, which 2.11 refuses on them: docs/performance.md, "Torch 2.11 on GPU")."""
    if ac_mode == "selective-op" and schedule in ZERO_BUBBLE_SCHEDULES:
        raise ParallelConfigError(
            f"parallelism.pp_schedule={schedule!r} runs each backward as an input and a weight pass, which "
            f"activation_checkpoint.mode='selective-op' cannot (torch's selective checkpoint allows one backward per "
            f"block); use activation_checkpoint.mode 'full' or 'none', or a schedule among GPipe, 1F1B, "
            f"Interleaved1F1B, LoopedBFS"
        )
    if moe and schedule in ZERO_BUBBLE_SCHEDULES and torch_release() < (2, 13):
        raise ParallelConfigError(
            f"parallelism.pp_schedule={schedule!r} runs each backward as an input and a weight pass, which torch "
            f"{'.'.join(map(str, torch_release()))} cannot start from the routed experts' custom autograd functions; "
            f"use torch >= 2.13, or a schedule among GPipe, 1F1B, Interleaved1F1B, LoopedBFS"
        )


def torch_release() -> tuple[int, int]:
    """torch's (major, minor), read from the installed package's metadata: the launcher checks
    before it imports torch."""
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    return int(major), int(minor)


def check_compile(schedule: str, compile_blocks: bool) -> None:
    """Zero-bubble schedules split each backward into an input part and a weight part, which
    torch.compile'd blocks do not support (torch refuses them for ZBVZeroBubble and DualPipeV)."""
    if compile_blocks and schedule in ZERO_BUBBLE_SCHEDULES:
        raise ParallelConfigError(
            f"parallelism.pp_schedule={schedule!r} splits backward into input and weight passes, which compiled "
            f"blocks do not support; use compile.enable=false or a schedule among GPipe, 1F1B, Interleaved1F1B, "
            f"LoopedBFS"
        )


def ddp_alone(dp_mode: str, degrees: Mapping[str, int]) -> bool:
    """DDP and no other parallelism (dp_replicate > 1, every other degree 1, dp_mode fsdp): the
    layouts DDP runs by gradient hooks (parallel/gradient_all_reduce.py), not by FSDP's replicate."""
    return dp_mode == "fsdp" and degrees.get("dp_replicate", 1) > 1 and all(
        d == 1 for name, d in degrees.items() if name != "dp_replicate")
