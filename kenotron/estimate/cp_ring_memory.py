"""Context parallel on fake tensors: the attention a CUDA job runs under cp, and the batch shard.

Under `parallelism.cp > 1` the plan puts a parameterless CP attention module in every attention
layer (kenotron/parallel/context/apply.py) and the trainer feeds each rank its local shard of
the sequence, seq_len / cp tokens in the head-tail layout, with their global RoPE positions. The
estimator builds the job on a CPU mesh; a CUDA job runs torch's context-parallel SDPA
(resolve_run settles `cp_attention` for the planned CUDA machine), so the plan builds the
trainer's `TorchRingAttention` there too (torch's `_ContextParallel` style, DTensor inputs,
torch's dispatcher) and this module makes torch's own ring run on fake tensors:

- torch's dispatcher routes only the CUDA SDPA ops (flash, efficient, cuDNN) into its ring
  (`_templated_ring_attention` and its backward). Fake CPU tensors pick
  `_scaled_dot_product_flash_attention_for_cpu`, so for the duration of an estimate that op and
  its backward are routed into the *same* torch functions (as the test of torch's ring on CPU
  does, tests/parallel/test_context_torch_ring.py). Everything the ring allocates is therefore
  torch's own code: the k/v concatenation and its all-gather (cp x the local k/v, allgather
  rotation) or one rotating block (alltoall), the per-step partial outputs converted to fp32,
  the log-sum-exp merges and the head-tail partial updates (chunk + cat), and in backward the
  fp32 gradient accumulators, the second all-gather and the rotating fp32 k/v gradients.
- Only the kernel differs: the CPU flash op's fake kernel allocates what the CUDA flash and
  cuDNN kernels return -- the output in the (batch, seq, heads, dim) layout of the queries,
  grouped k/v heads unrepeated, a float32 log-sum-exp -- and nothing of the kernels' internal
  workspace (as for attention without CP).
- Functional collectives on the fake process group return fake tensors of the gathered shape
  (the tracker makes `wait_tensor` return its input, as it does eagerly).

torch keeps its CP options and DTensor's custom op handlers process-wide; `torch_cp_state`
saves them before a fake job is built and restores them after, so an estimate leaves the
process as it found it. Where the job would run kenotron's ring (`cp_attention = "ring"`, or
`training.device = "cpu"`) the plan's `RingAttention` is kept and runs as it is.

Document masking on CUDA runs `FlexContextAttention` (cp_attention "flex", flex_gather.py): its
all-gathers run as they are, and flex's kernel is replaced by SDPA of the local queries against
the gathered keys/values without a mask (`use_flex_memory`), which on fake CPU tensors allocates
what flex returns and keeps on CUDA: the output and a float32 log-sum-exp, with the gathered
keys/values (cp x the local ones) saved for backward in every layer. The block masks (a few
bytes per 128 x 128 tile) are left out.

Compiled, fully checkpointed Ulysses blocks kept more on GPUs than the eager simulation keeps
(`ulysses_checkpoint_bytes`, measured on 2 x H100): the closed form counts it, and the report's
context note gives its size.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard

from kenotron.dtensor import local_tensor
from kenotron.estimate.breakdown import allocated_bytes
from kenotron.parallel.context.flex_gather import FlexContextAttention
from kenotron.parallel.context.torch_ring import torch_cp_api
from kenotron.parallel.dims import Meshes
from kenotron.train.resolve import ResolvedRun

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def cp_attention_kind(run: ResolvedRun) -> str | None:
    """"torch", "flex", "ring" or "ulysses": the CP attention the job runs (resolve_run settled it); None
    without CP. Ulysses' all-to-alls are functional collectives, which the fake process group runs as they are."""
    if run.dims.cp == 1:
        return None
    if run.plan.settings.cp_scheme == "ulysses":
        return "ulysses"
    return run.plan.settings.cp_attention


def ring_kind(run: ResolvedRun) -> str | None:
    """The ring attention the job runs ("torch", "flex" or "ring"): cp_attention under the ring
    scheme, and under Ulysses where the heads split over part of cp only (the ring inside the
    all-to-all, parallel/context/ulysses.py); None where no ring runs."""
    d, st = run.dims, run.plan.settings
    if d.cp == 1 or (st.cp_scheme == "ulysses" and (st.cp_ulysses_degree or d.cp) == d.cp):
        return None
    return st.cp_attention


def _sharded(tensors: Any, mesh: Any) -> tuple[DTensor, ...]:
    # torch's own handler wraps its local results with the output spec of sharding propagation:
    # sharded along the sequence (dim 2) on the cp mesh, as here.
    return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in tensors)


def _ring_forward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, ...]:
    """torch's ring forward around the CPU flash op, as its dispatcher runs it around CUDA's."""
    q, k, v, *rest = args
    dropout_p = rest[0] if len(rest) > 0 else kwargs.get("dropout_p", 0.0)
    is_causal = rest[1] if len(rest) > 1 else kwargs.get("is_causal", False)
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("torch's context-parallel SDPA takes no attention mask")
    mesh = q.device_mesh
    out, lse = torch_cp_api()._templated_ring_attention(
        mesh.get_group(), 2, CPU_FLASH, local_tensor(q), local_tensor(k), local_tensor(v), is_causal=is_causal,
        dropout_p=dropout_p, scale=kwargs.get("scale"),
    )
    return _sharded((out, lse), mesh)


def _ring_backward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, ...]:
    grad_out, q, k, v, out, lse, dropout_p, is_causal = args
    mesh = q.device_mesh
    grads = torch_cp_api()._templated_ring_attention_backward(
        mesh.get_group(), 2, CPU_FLASH_BACKWARD, local_tensor(grad_out), "grad_out", local_tensor(q), local_tensor(k),
        local_tensor(v), local_tensor(out), local_tensor(lse), is_causal, dropout_p=dropout_p, scale=kwargs.get("scale"),
    )
    return _sharded(grads[:3], mesh)


@contextlib.contextmanager
def torch_cp_state() -> Iterator[None]:
    """Save torch's process-wide context-parallel state and restore it on exit.

    `TorchRingAttention` sets torch's CP options and enables its dispatcher (DTensor's custom
    op handlers, CP sharding rules); `use_torch_ring` adds the CPU flash handlers. None of it
    may outlive the estimate: the next job in the process (or the next test) starts clean.
    """
    api = torch_cp_api()
    options = dataclasses.replace(api._cp_options)
    dispatcher = DTensor._op_dispatcher
    handlers = dict(dispatcher._custom_op_handlers)
    enabled = aten._scaled_dot_product_flash_attention.default in handlers
    try:
        yield
    finally:
        if not enabled:
            api._disable_context_parallel_dispatcher()
        dispatcher._custom_op_handlers = handlers
        for f in dataclasses.fields(options):
            setattr(api._cp_options, f.name, getattr(options, f.name))


def use_torch_ring(run: ResolvedRun, meshes: Meshes) -> None:
    """Where the job runs torch's ring (the plan built its `TorchRingAttention` on the fake CPU
    mesh), route the fake tensors' SDPA op into torch's ring. Call inside `torch_cp_state`."""
    if ring_kind(run) != "torch":
        return
    dispatcher = DTensor._op_dispatcher
    dispatcher._custom_op_handlers = {
        **dispatcher._custom_op_handlers, CPU_FLASH: _ring_forward, CPU_FLASH_BACKWARD: _ring_backward,
    }


def _unmasked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])


def use_flex_memory(run: ResolvedRun, model: torch.nn.Module) -> None:
    """Where the job runs FlexAttention under cp, give every FlexContextAttention of `model` the
    fused kernel's allocations in place of flex's (module docstring)."""
    if ring_kind(run) != "flex":
        return
    for module in model.modules():
        if isinstance(module, FlexContextAttention):
            module.kernel = _unmasked_sdpa


def attention_output_copy(run: ResolvedRun) -> bool:
    """Whether the simulated rank's output projection keeps its own copy of the attention output.

    SDPA's fused kernels return the output in the queries' (batch, seq, heads, dim) layout, so
    the attention module's `transpose(1, 2).reshape(...)` is a view and the output projection
    saves the very tensor the attention saved. torch's load-balanced ring merges the second
    half of rank r's queries with `_partial_update` (chunk + cat) at every step after r, which
    returns a contiguous (batch, heads, seq, dim) tensor: on every rank but the last (rank 0
    among them, the one simulated) the reshape copies it, one more T·H·h tensor per block,
    measured on 4 x H200 (docs/estimation.md). kenotron's ring returns it contiguous on every
    rank. torch's ring without load balancing merges element-wise and keeps the layout. Under
    Ulysses the kernel saves its own output (the whole sequence, heads/cp heads: as many bytes),
    and the output projection the tensor the inverse all-to-all made: two tensors too.
    """
    kind = cp_attention_kind(run)
    return kind in ("ring", "ulysses") or (kind == "torch" and run.plan.settings.cp_load_balance)


def ulysses_checkpoint_bytes(run: ResolvedRun, tokens: int, c: int) -> int:
    """What a compiled block under full AC keeps per block with Ulysses (cp > 1), beyond its
    input: T·(H + 2K')·h·c / t + T·H·h·c / t, the sizes of the two all-to-alls' outputs (q, k, v
    scattered over the heads; the attention output gathered back; K' the kv heads sent, each
    repeated where the rank's kv heads do not divide cp): what the GPU rows kept over the ring's
    peak, these bytes per block (docs/parallelism.md, "Ring or all-to-all"); what keeps them was
    not traced. Eager blocks, selective-op and no AC have no GPU row under Ulysses: 0 there."""
    settings, a, d = run.plan.settings, run.model_args, run.dims
    if d.cp == 1 or settings.cp_scheme != "ulysses" or not settings.compile or settings.ac_mode != "full":
        return 0
    heads = a.n_heads // d.tp
    kv = (getattr(a, "n_kv_heads", None) or a.n_heads) // d.tp  # MLA: keys and values per query head
    ulysses = settings.cp_ulysses_degree or d.cp  # the all-to-all's ranks (a ring may span the rest of cp)
    kv_sent = kv if kv % ulysses == 0 else ulysses
    qk = a.qk_dim if hasattr(a, "qk_dim") else a.head_dim  # MLA: values are v_dim wide
    v = getattr(a, "v_dim", qk)
    scattered = tokens * ((heads + kv_sent) * qk + kv_sent * v) * c
    return allocated_bytes(scattered) + allocated_bytes(tokens * heads * v * c)


def context_notes(run: ResolvedRun) -> list[str]:
    """What the report should say about a context-parallel estimate."""
    kind = cp_attention_kind(run)
    if kind is None:
        return []
    rotation = run.plan.settings.cp_rotate_method
    attention = {
        "torch": f"torch's ring over the fused SDPA kernels, {rotation} rotation",
        "flex": "FlexAttention against the all-gathered keys/values (kept for backward: cp x the local ones per layer)",
        "ulysses": "all-to-all of heads (ulysses) around the attention kernel",
    }.get(kind, f"kenotron's ring attention, {rotation} rotation")
    inner = ring_kind(run) if kind == "ulysses" else None
    if inner is not None:  # heads that split over part of cp: the ring inside the all-to-all
        ulysses = run.plan.settings.cp_ulysses_degree
        ring = {"torch": "torch's ring", "flex": "FlexAttention's gathered ring"}.get(inner, "kenotron's ring")
        attention = (f"all-to-all of heads (ulysses) over {ulysses} ranks around {ring} over the other "
                     f"{run.dims.cp // ulysses}")
    if run.cfg.data.document_masking:
        attention += ", document-masked (the mask's skipped work is not counted in memory; the throughput model prices it)"
    layout = "load balanced" if run.plan.settings.cp_load_balance else "contiguous"
    note = f"context parallel: {attention}, {layout}, {run.cfg.training.seq_len // run.dims.cp} tokens per rank"
    if kind == "torch" and run.plan.settings.cp_load_balance:
        note += "; the last cp rank keeps one attention output per block less than rank 0 (simulated)"
    kept = ulysses_checkpoint_bytes(run, run.cfg.training.local_batch_size * run.cfg.training.seq_len // run.dims.cp,
                                    2 if run.cfg.training.param_dtype == "bfloat16" else 4)
    if kept:
        blocks = run.model_args.n_layers // run.dims.pp
        note += (f"; compiled, fully checkpointed Ulysses blocks also keep what matches their all-to-alls' outputs on "
                 f"GPUs, {kept * blocks / 2**30:.2f} GiB over {blocks} blocks, not simulated here (the closed form "
                 f"counts it; docs/estimation.md)")
    return [note]
