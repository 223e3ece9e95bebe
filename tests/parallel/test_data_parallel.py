"""Data-parallel modes: ZeRO-1 shards optimizer state, replicas skip all-reduce on non-final micro-steps."""

from __future__ import annotations

import dataclasses

import torch

from kenotron.config import load_config
from kenotron.models import get_model_spec
from kenotron.parallel.data_parallel import head_modules
from kenotron.parallel.parallel_settings import ParallelSettings
from kenotron.parallel.plan import layout_for
from kenotron.parallel.zero1 import partition_params
from kenotron.train.step import forward_backward
from kenotron.train.trainer import Trainer
from tests.distributed.pool import run_on_ranks


def test_partition_balances_element_counts_deterministically():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (100, 60, 50, 40, 10)]
    owners = partition_params(params, 2)
    # Largest first, each to the least-loaded rank: 100->0, 60->1, 50->1, 40->0, 10->1.
    assert owners == [0, 1, 1, 0, 1]
    assert partition_params(params, 2) == owners


def _optimizer_state_bytes(mode: str, folder: str) -> int:
    cfg = load_config(None, [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--parallelism.dp_mode", mode, "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ] + (["--parallelism.dp_replicate", "4", "--parallelism.dp_shard", "1"] if mode == "fsdp" else []))
    trainer = Trainer(cfg)
    trainer.run_step(trainer.loader.next_step())
    opt = trainer.job.optimizers[0]
    state = opt.inner.state if mode == "zero1" else opt.state
    total = 0
    for s in state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor) and v.ndim > 0:
                local = v.to_local() if hasattr(v, "to_local") else v
                total += local.numel() * local.element_size()
    trainer.close()
    return total


def test_zero1_optimizer_state_per_rank_is_about_one_over_dp(tmp_path):
    ddp = run_on_ranks(4, _optimizer_state_bytes, "fsdp", str(tmp_path / "ddp"))  # DDP: whole state
    zero1 = run_on_ranks(4, _optimizer_state_bytes, "zero1", str(tmp_path / "z1"))
    assert len(set(ddp)) == 1
    for per_rank in zero1:
        assert 0.20 < per_rank / ddp[0] < 0.30, (per_rank, ddp[0])
    assert abs(sum(zero1) - ddp[0]) < 1e-6 * ddp[0] + 1


def _all_reduce_flags_during_accumulation(folder: str) -> list[list[bool]]:
    from torch.distributed.fsdp import FSDPModule

    cfg = load_config(None, [
        "--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "1",
        "--training.global_batch_size", "8", "--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "2",
        "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ])
    trainer = Trainer(cfg)
    seen: list[list[bool]] = []
    original = trainer.job.applied.data_parallel.set_microstep

    def spy(model, is_last):
        original(model, is_last)
        seen.append([
            g.all_reduce_grads for m in model.modules() if isinstance(m, FSDPModule)
            for g in m._get_fsdp_state()._fsdp_param_groups
        ])

    trainer.job.applied.data_parallel.set_microstep = spy
    forward_backward(trainer.job, trainer.loader.next_step())
    trainer.close()
    return seen


def test_hsdp_skips_the_replica_all_reduce_on_non_final_micro_steps(tmp_path):
    seen = run_on_ranks(4, _all_reduce_flags_during_accumulation, str(tmp_path))[0]
    assert len(seen) == 2  # 8 sequences / (1 x dp 4) = 2 micro-steps
    assert not any(seen[0]) and all(seen[1])


def _fsdp_grads(reduce_dtype: str, folder: str) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import FSDPModule

    cfg = load_config(None, [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--parallelism.dp_shard", "2", "--parallelism.fsdp_reduce_dtype", reduce_dtype,
        "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ])
    trainer = Trainer(cfg)
    policies = {g.mp_policy.reduce_dtype for m in trainer.job.model.modules() if isinstance(m, FSDPModule)
                for g in m._get_fsdp_state()._fsdp_param_groups}
    assert policies == {getattr(torch, reduce_dtype)}, policies
    forward_backward(trainer.job, trainer.loader.next_step())
    grads = {n: p.grad.to_local().clone() for n, p in trainer.job.model.named_parameters()}
    trainer.close()
    return grads


def test_fsdp_bf16_reduce_keeps_fp32_sharded_grads_within_bf16_rounding_of_fp32_reduce(tmp_path):
    exact = run_on_ranks(2, _fsdp_grads, "float32", str(tmp_path / "fp32"))
    rounded = run_on_ranks(2, _fsdp_grads, "bfloat16", str(tmp_path / "bf16"))
    differs = False
    for rank in range(2):
        for name, g in exact[rank].items():
            r = rounded[rank][name]
            assert r.dtype == torch.float32 == g.dtype, name
            # A few bf16 roundings (the averaging division, the two-term sum), each under 2^-8 relative.
            assert (r - g).abs().max() <= 2 ** -6 * g.abs().max() + 1e-12, name
            differs |= not torch.equal(r, g)
    assert differs  # the bf16 reduction really ran (a sum of two bf16 values rounds)


def _train_with_early_gather(early: bool, folder: str) -> tuple[list[float], dict[str, torch.Tensor], bool]:
    cfg = load_config(None, [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--parallelism.dp_shard", "2", "--tuning.fsdp_early_all_gather", str(early).lower(),
        "--training.param_dtype", "float32", "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ])
    trainer = Trainer(cfg)
    assert (trainer.job.early_gather is not None) == early
    losses, issued = [], False
    for _ in range(3):
        loss, _norm = trainer.run_step(trainer.loader.next_step())
        losses.append(float(loss))
        if early:  # the next step's first all-gathers are in flight before its forward
            groups = [u._get_fsdp_state()._fsdp_param_group for u in trainer.job.early_gather.units]
            issued = all(g._all_gather_result is not None for g in groups)
    params = {n: p.detach().to_local().clone() for n, p in trainer.job.model.named_parameters()}
    trainer.close()
    return losses, params, issued


def test_early_all_gather_trains_bit_for_bit_like_one_optimizer_step_and_prefetches(tmp_path):
    early = run_on_ranks(2, _train_with_early_gather, True, str(tmp_path / "early"))
    plain = run_on_ranks(2, _train_with_early_gather, False, str(tmp_path / "plain"))
    for (losses_e, params_e, issued), (losses_p, params_p, _) in zip(early, plain, strict=True):
        assert issued
        assert losses_e == losses_p
        assert params_e.keys() == params_p.keys()
        for name, value in params_e.items():
            assert torch.equal(value, params_p[name]), name


def _post_backward_order(folder: str) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    cfg = load_config(None, [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--parallelism.dp_shard", "2", "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ])
    trainer = Trainer(cfg)
    order: list[str] = []
    states = {id(m._get_fsdp_state()): m._get_fsdp_state() for m in trainer.job.model.modules() if isinstance(m, FSDPModule)}
    names = {id(m): n for n, m in trainer.job.model.named_modules()}
    for state in states.values():
        for group in state._fsdp_param_groups:
            label = ",".join(names[id(m)] for m in group.modules) or "root"
            original = group.post_backward

            def spy(*args, _original=original, _label=label, _group=group):
                if _group.reduce_grads and _label not in order:
                    order.append(_label)
                return _original(*args)

            group.post_backward = spy
    forward_backward(trainer.job, trainer.loader.next_step())
    trainer.close()
    return order


def test_the_final_norm_and_output_reduce_their_gradients_first_and_the_root_last(tmp_path):
    order = run_on_ranks(2, _post_backward_order, str(tmp_path))[0]
    # The head is its own unit, reduced right after its backward (the step's first), before the
    # blocks'; the root (the embedding alone) is reduced at the end.
    assert order == ["norm,output", "layers.1", "layers.0", "root"], order


def test_a_tied_output_stays_in_the_root_unit():
    spec = get_model_spec("llama3")
    for tied in (False, True):
        args = dataclasses.replace(spec.flavors["debug"], n_layers=1, tie_embeddings=tied)
        with torch.device("meta"):
            model = spec.build(args)
        head = head_modules(model, layout_for(spec, args))
        assert head == ([] if tied else [model.norm, model.output])


def _moe_reduce(reduce_dtype: str, param_dtype: str, folder: str) -> tuple[dict[str, torch.dtype], dict[str, torch.Tensor]]:
    from torch.distributed.fsdp import FSDPModule

    cfg = load_config("qwen3_moe_debug", [
        "--model.n_layers", "2", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--parallelism.dp_shard", "2", "--parallelism.fsdp_reduce_dtype", reduce_dtype,
        "--training.param_dtype", param_dtype, "--job.dump_folder", folder, "--metrics.tensorboard", "false",
    ])
    trainer = Trainer(cfg)
    names = {id(m): n for n, m in trainer.job.model.named_modules()}
    policies = {names[id(m)] or "root": m._get_fsdp_state()._fsdp_param_group.mp_policy.reduce_dtype
                for m in trainer.job.model.modules() if isinstance(m, FSDPModule)}
    forward_backward(trainer.job, trainer.loader.next_step())
    grads = {n: p.grad.to_local().clone() for n, p in trainer.job.model.named_parameters()}
    trainer.close()
    return policies, grads


def test_auto_reduces_the_routed_experts_in_bf16_and_everything_else_exactly_as_fp32(tmp_path):
    auto_policies, auto_grads = run_on_ranks(2, _moe_reduce, "auto", "bfloat16", str(tmp_path / "auto"))[0]
    exact_policies, exact_grads = run_on_ranks(2, _moe_reduce, "float32", "bfloat16", str(tmp_path / "fp32"))[0]
    experts = {"layers.0.feed_forward.experts", "layers.1.feed_forward.experts"}
    assert {n for n, d in auto_policies.items() if d == torch.bfloat16} == experts, auto_policies
    assert set(auto_policies) - experts == set(exact_policies)  # fp32: the experts stay in their blocks
    assert set(exact_policies.values()) == {torch.float32}
    rounded = False
    for name, g in exact_grads.items():
        if ".experts." in name:
            assert (auto_grads[name] - g).abs().max() <= 2 ** -7 * g.abs().max() + 1e-12, name
            rounded |= not torch.equal(auto_grads[name], g)
        else:  # the same local backward; only the experts' sums are rounded
            assert torch.equal(auto_grads[name], g), name
    assert rounded



def test_auto_keeps_fp32_sums_for_fp32_training_and_a_named_dtype_everywhere():
    # fp32 training keeps the experts in their blocks with fp32 sums (the CPU parity tests' exact reduction).
    assert ParallelSettings(reduce_dtype="auto", param_dtype="float32").reduce_dtypes() == ("float32", "float32")
    assert ParallelSettings(reduce_dtype="auto", param_dtype="bfloat16").reduce_dtypes() == ("float32", "bfloat16")
    for dtype in ("float32", "bfloat16"):
        assert ParallelSettings(reduce_dtype=dtype, param_dtype="bfloat16").reduce_dtypes() == (dtype, dtype)
