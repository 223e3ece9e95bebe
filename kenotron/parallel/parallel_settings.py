"""The run's parallel settings: how a plan applies its layout, taken from the job config.

Every field names the config key it comes from (`key_of`), so an error about a setting names
what the user wrote (`activation_checkpoint.offload_blocks=100 ...`). `check` is the one
place where settings are checked, alone and against the mesh degrees; `resolve_run` calls it
before any process group exists and `Plan.apply` again for hand-made plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from kenotron.config import JobConfig
from kenotron.degrees import CP_SCHEMES
from kenotron.parallel.activation_checkpoint import AC_MODES
from kenotron.parallel.context.ring import ROTATE_METHODS
from kenotron.parallel.model_layout import PlanError

DP_MODES = ("fsdp", "zero1")
RESHARD_POLICIES = ("default", "always", "never")
CP_ATTENTION_CHOICES = ("auto", "torch", "ring", "flex")
DTYPES = ("float32", "bfloat16")
REDUCE_DTYPES = ("auto", *DTYPES)


def _key(name: str) -> dict[str, str]:
    return {"key": name}


@dataclass
class ParallelSettings:
    """Run settings of a plan; every field is plain data with its config key."""

    sequence_parallel: bool = field(default=True, metadata=_key("parallelism.sequence_parallel"))
    """With tp > 1, also shard the residual stream and norms along the sequence."""
    loss_parallel: bool = field(default=True, metadata=_key("tuning.loss_parallel"))
    """With tp > 1, compute the cross-entropy on vocabulary shards (no full logits gathered)."""
    async_tp: bool = field(default=False, metadata=_key("parallelism.async_tp"))
    """Overlap TP collectives with matmuls (CUDA + compile only)."""
    dp_mode: str = field(default="fsdp", metadata=_key("parallelism.dp_mode"))
    """fsdp: shard params, grads and optimizer state (HSDP with dp_replicate; DDP if dp_shard is 1);
    zero1: replicate params and grads, shard only the optimizer state."""
    reshard_after_forward: str = field(default="default", metadata=_key("parallelism.fsdp_reshard_after_forward"))
    """default: free gathered params after forward except the last block; always; never."""
    param_dtype: str = field(default="float32", metadata=_key("training.param_dtype"))
    """Compute dtype of parameters (FSDP mixed precision, or autocast without FSDP)."""
    reduce_dtype: str = field(default="auto", metadata=_key("parallelism.fsdp_reduce_dtype"))
    """Dtype of the data-parallel gradient reduction; auto: with bf16 compute, bfloat16 for the routed experts and float32 for the rest."""
    gradients_in_compute_pool: bool = field(default=True, metadata=_key("tuning.fsdp_gradients_in_compute_pool"))
    """Under FSDP on CUDA: allocate the sharded gradients from the compute stream's pool."""
    early_all_gather: bool = field(default=True, metadata=_key("tuning.fsdp_early_all_gather"))
    """Under FSDP: start the next step's first all-gathers during the optimizer update."""
    ac_mode: str = field(default="none", metadata=_key("activation_checkpoint.mode"))
    """Activation checkpointing of blocks: none, full, selective-op, every-n-layers."""
    ac_every_n: int = field(default=2, metadata=_key("activation_checkpoint.every_n"))
    """For every-n-layers: checkpoint one block in every this many."""
    ac_save_matmul_every: int = field(default=1, metadata=_key("tuning.ac_save_matmul_every"))
    """For selective-op: keep one matmul output in every this many (the rest are recomputed)."""
    offload_blocks: int = field(default=0, metadata=_key("activation_checkpoint.offload_blocks"))
    """The first this many blocks of each model part keep their saved activations in host memory."""
    compile: bool = field(default=False, metadata=_key("compile.enable"))
    """torch.compile each block."""
    float8: str = field(default="", metadata=_key("float8.recipe"))
    """torchao float8 recipe of the linear layers ("tensorwise" or "rowwise"); empty: off."""
    float8_experts: bool = field(default=False, metadata=_key("float8.experts"))
    """Run the routed experts' grouped GEMMs in float8 (parallel/float8.py)."""
    float8_all_gather: bool = field(default=False, metadata=_key("tuning.float8_all_gather"))
    """With the tensorwise recipe under FSDP, all-gather weights in float8."""
    cp_load_balance: bool = field(default=True, metadata=_key("tuning.cp_load_balance"))
    """Context parallel: rank r holds chunks r and 2*cp-1-r of 2*cp (even causal work)."""
    cp_rotate_method: str = field(default="allgather", metadata=_key("tuning.cp_rotate_method"))
    """Context parallel: keys/values by one all-gather ("allgather") or a ring of sends ("alltoall")."""
    cp_attention: str = field(default="auto", metadata=_key("tuning.cp_attention"))
    """Context-parallel attention: torch (its ring over fused SDPA; CUDA), ring (kenotron's), auto (by device)."""
    cp_scheme: str = field(default="ring", metadata=_key("parallelism.cp_scheme"))
    """Context parallel by a ring of keys/values (cp_attention says whose) or by all-to-all of heads ("ulysses");
    "auto" until planner/cp_scheme_choice.py settles it (unsettled, it runs the ring)."""
    cp_ulysses_degree: int = field(default=0, metadata=_key("parallelism.cp_scheme"))
    """Under cp_scheme "ulysses": the ranks of each all-to-all, a ring over the other cp / it (derived, no
    config key: resolve_run sets the largest divisor of cp the heads per tp rank split over); 0: all of cp."""

    @classmethod
    def from_config(cls, cfg: JobConfig) -> ParallelSettings:
        p, u, ac = cfg.parallelism, cfg.tuning, cfg.activation_checkpoint
        return cls(
            sequence_parallel=p.sequence_parallel, loss_parallel=u.loss_parallel, async_tp=p.async_tp,
            dp_mode=p.dp_mode, reshard_after_forward=p.fsdp_reshard_after_forward,
            param_dtype=cfg.training.param_dtype, reduce_dtype=p.fsdp_reduce_dtype,
            gradients_in_compute_pool=u.fsdp_gradients_in_compute_pool, early_all_gather=u.fsdp_early_all_gather,
            ac_mode=ac.mode, ac_every_n=ac.every_n, ac_save_matmul_every=u.ac_save_matmul_every,
            offload_blocks=ac.offload_blocks, compile=cfg.compile.enable,
            float8=cfg.float8.recipe if cfg.float8.enable else "", float8_all_gather=u.float8_all_gather,
            float8_experts=cfg.float8.enable and cfg.float8.experts,
            cp_load_balance=u.cp_load_balance, cp_rotate_method=u.cp_rotate_method, cp_attention=u.cp_attention,
            cp_scheme=p.cp_scheme,
        )

    @staticmethod
    def key_of(name: str) -> str:
        """The config key a field comes from (`offload_blocks` -> `activation_checkpoint.offload_blocks`)."""
        return {f.name: f.metadata["key"] for f in dataclasses.fields(ParallelSettings)}[name]

    def _bad(self, name: str, why: str) -> PlanError:
        return PlanError(f"{self.key_of(name)}={getattr(self, name)!r} {why}")

    def check(self, n_blocks: int, degrees: Mapping[str, int] | None = None) -> None:
        """Valid values, and combinations the mesh degrees (`degrees`: pp, cp, ...) cannot run."""
        for name, valid in (
            ("dp_mode", DP_MODES), ("reshard_after_forward", RESHARD_POLICIES), ("ac_mode", AC_MODES),
            ("param_dtype", DTYPES), ("reduce_dtype", REDUCE_DTYPES), ("cp_rotate_method", ROTATE_METHODS),
            ("cp_attention", CP_ATTENTION_CHOICES), ("cp_scheme", ("auto", *CP_SCHEMES)), ("float8", ("", "tensorwise", "rowwise")),
        ):
            if getattr(self, name) not in valid:
                raise self._bad(name, f"is not one of {', '.join(map(repr, valid))}")
        if self.ac_every_n < 1:
            raise self._bad("ac_every_n", "must be >= 1 (1 checkpoints every block)")
        if self.ac_save_matmul_every < 1:
            raise self._bad("ac_save_matmul_every", "must be >= 1 (1 keeps every matmul output)")
        if not 0 <= self.offload_blocks <= n_blocks:
            raise self._bad("offload_blocks", f"must lie in [0, {n_blocks}] (the model's blocks)")
        degrees = degrees or {}
        cp = degrees.get("cp", 1)
        if self.cp_ulysses_degree < 0 or (self.cp_ulysses_degree and cp % self.cp_ulysses_degree):
            raise PlanError(f"plan.settings.cp_ulysses_degree={self.cp_ulysses_degree} must divide cp={cp} (0: all of "
                            f"cp); set it to a divisor of cp that the heads per tp rank split over")
        # ZeRO-1 shares optimizer state over the ranks that hold the same parameters: data and
        # context parallel (cp ranks hold the same parameters, each with part of every sequence).
        shared = degrees.get("dp_replicate", 1) * degrees.get("dp_shard", 1) * degrees.get("cp", 1)
        if self.dp_mode == "zero1" and shared == 1 and any(d > 1 for d in degrees.values()):
            raise self._bad("dp_mode", "needs ranks to share optimizer state over: dp_shard, dp_replicate or cp > 1")

    def reduce_dtypes(self) -> tuple[str, str]:
        """(the dense parameters', the routed experts') gradient reduction dtypes. Under auto with
        bf16 compute the experts reduce in bf16: they are most of an MoE model's bytes, computed in
        bf16 already, and 50 steps of the debug MoE stay within 1% of fp32 reduction step by step
        (docs/performance.md, "MoE FSDP"); fp32 training keeps fp32 sums throughout."""
        if self.reduce_dtype == "auto":
            return "float32", "bfloat16" if self.param_dtype == "bfloat16" else "float32"
        return self.reduce_dtype, self.reduce_dtype

    def _reduce_detail(self) -> str:
        dense, experts = self.reduce_dtypes()
        return f" (experts {experts}, the rest {dense})" if self.reduce_dtype == "auto" else ""

    def __str__(self) -> str:
        ac = self.ac_mode + (f" (every {self.ac_every_n})" if self.ac_mode == "every-n-layers" else "")
        if self.ac_mode == "selective-op" and self.ac_save_matmul_every > 1:
            ac += f" (one matmul output kept in {self.ac_save_matmul_every})"
        return "\n".join([
            "ParallelSettings",
            (f"  sequence_parallel: {self.sequence_parallel}   loss_parallel: {self.loss_parallel}   "
             f"async_tp: {self.async_tp}"),
            (f"  data parallel: {self.dp_mode}, reshard_after_forward {self.reshard_after_forward}, params "
             f"{self.param_dtype}, reduce {self.reduce_dtype}{self._reduce_detail()}, early all-gather "
             f"{self.early_all_gather}"),
            f"  activation checkpointing: {ac}"
            + (f"   offload: first {self.offload_blocks} blocks" if self.offload_blocks else "")
            + f"   compile: {self.compile}   float8: {self.float8 or 'off'}",
            ("  context parallel (when cp > 1): all-to-all of heads (ulysses"
             + (f" over {self.cp_ulysses_degree} ranks; a ring spans cp / {self.cp_ulysses_degree} where that is > 1"
                if self.cp_ulysses_degree else "")
             + f"), load_balance {self.cp_load_balance}"
             if self.cp_scheme == "ulysses" else
             f"  context parallel (when cp > 1): attention {self.cp_attention}, load_balance "
             f"{self.cp_load_balance}, rotate {self.cp_rotate_method}"),
        ])
