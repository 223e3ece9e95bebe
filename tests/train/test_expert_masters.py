"""The routed experts outside FSDP (ep = dp_shard x cp, no dp_replicate, no pp) train in bf16 with
fp32 masters in AdamW (Choices.expert_masters, train/master_weights.py's `masters_for`), as one GPU
trains every weight: the choice's rule, the optimizer with masters for some parameters only, the
same losses as fp32 experts bit for bit, and checkpoints that hold fp32 experts (the masters) and
move between ep 2 on 2 ranks and layouts whose experts are FSDP units."""

from __future__ import annotations

import shutil
from pathlib import Path
from unittest import mock

import torch
import torch.distributed.checkpoint as dcp

from kenotron.checkpoint.folders import step_folder_name
from kenotron.config import load_config
from kenotron.train.master_weights import MasterWeightAdamW
from kenotron.train.resolve import resolve_run
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, short_run_args

# No clipping (max_norm far above the norm): the clip multiplies bf16 gradients in bf16 where the
# optimizer does not divide inside its kernel (CPU), the one step that would round differently.
MOE_BF16 = ["--model.name", "qwen3_moe", "--moe.z_loss_coef", "0.001", "--moe.bias_update_rate", "0.001",
            "--training.param_dtype", "bfloat16", "--training.max_norm", "1e9"]
EP2_ON_2 = ["--parallelism.ep", "2", "--training.local_batch_size", "4"]
EP2_ON_4 = ["--parallelism.ep", "2", "--training.local_batch_size", "2"]
SAVING = ["--checkpoint.enable", "true", "--checkpoint.interval", "2"]
EXPERT = "layers.0.feed_forward.experts.w13"


def _choice(world: int, *overrides: str) -> bool:
    cfg = load_config(None, ["--model.name", "qwen3_moe", "--training.param_dtype", "bfloat16",
                             "--training.device", "cpu", *overrides])
    return resolve_run(cfg, world_size=world).choices.expert_masters


def test_experts_keep_masters_only_outside_fsdp_under_adamw_without_accumulation():
    assert _choice(2, *EP2_ON_2)
    assert _choice(4, "--parallelism.ep", "4", "--training.local_batch_size", "2")
    assert not _choice(4, *EP2_ON_4)  # efsdp 2: the experts are FSDP units
    assert not _choice(2, *EP2_ON_2, "--training.global_batch_size", "16")  # two micro-steps
    assert not _choice(2, *EP2_ON_2, "--optimizer.name", "sgd")
    assert not _choice(2, *EP2_ON_2, "--training.param_dtype", "float32")
    assert not _choice(2, "--training.local_batch_size", "4")  # no expert parallelism


def test_optimizer_with_masters_for_some_parameters_steps_the_others_as_fp32_adamw():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(4, 8)), torch.nn.Parameter(torch.randn(8))
    ref_a, ref_b = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    opt = MasterWeightAdamW([a, b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, masters_for=[a])
    ref = torch.optim.AdamW([ref_a, ref_b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, foreach=True)
    assert (a.dtype, b.dtype) == (torch.bfloat16, torch.float32)
    for _ in range(3):
        ga, gb = torch.randn(4, 8).bfloat16(), torch.randn(8)
        a.grad, b.grad, ref_a.grad, ref_b.grad = ga, gb.clone(), ga.float(), gb.clone()
        opt.step()
        ref.step()
    assert torch.equal(b, ref_b)  # the plain parameter: torch's AdamW, bit for bit
    assert torch.equal(opt.state[a]["master"], ref_a) and torch.equal(a, ref_a.bfloat16())
    # The model part of a checkpoint holds the master (checkpoint/state.py): the optimizer's state
    # dict has none, and loading it keeps the master the model part loaded.
    saved = opt.state_dict()
    assert "master" not in saved["state"][0] and "master" not in saved["state"][1]
    master = opt.checkpointed_master(a)
    assert master is opt.state[a]["master"] and opt.checkpointed_master(b) is None
    opt.load_state_dict(saved)
    assert opt.state[a]["master"] is master and opt.state[b]["exp_avg"].dtype == torch.float32


SHORT = ["--training.steps", "3", "--metrics.log_freq", "1"]  # checkpoints at step 2 and the last, 3


def _train_with_or_without_masters(folder: str, masters: bool, overrides: list[str]) -> dict:
    """A short run (`SHORT`) whose experts keep masters, or are fp32 as before (the choice
    patched off); the parameters' dtypes."""
    import kenotron.kernel_choice.config_checks as checks
    from kenotron.train.trainer import Trainer

    with mock.patch.object(checks, "expert_masters", checks.expert_masters if masters else lambda *_: False):
        cfg = load_config(None, short_run_args(2) + ["--job.dump_folder", folder] + MOE_BF16 + SHORT + overrides)
        trainer = Trainer(cfg)
        dtypes = {name: p.dtype for name, p in trainer.job.model_parts[0].named_parameters()}
        try:
            trainer.train()
        finally:
            trainer.close()
    return dtypes


def _numbers(records: list[dict]) -> list[dict]:
    """What training computed (losses, norms, expert loads), not its timings or memory."""
    return [{k: v for k, v in r.items() if k in ("step", "loss", "grad_norm", "aux_loss", "z_loss")
             or k.startswith("moe_")} for r in records]


def _saved(folder: Path, step: int) -> dict:
    """{key: (size, dtype)} of the tensors the checkpoint of `step` holds."""
    metadata = dcp.FileSystemReader(str(folder / "checkpoints" / step_folder_name(step))).read_metadata()
    return {k: (v.size, v.properties.dtype) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "properties")}


def _resume(folder: Path, name: str) -> list[dict]:
    """The run in `folder` continued from its step 2 with masters on 2 ranks: its records."""
    copy = folder.parent / f"{folder.name}_{name}"
    shutil.copytree(folder, copy)
    (copy / "metrics.jsonl").unlink()
    run_on_ranks(2, _train_with_or_without_masters, str(copy), True, EP2_ON_2 + SAVING + ["--checkpoint.load_step", "2"])
    return _numbers(read_records(copy))


def test_ep2_experts_train_in_bf16_with_masters_as_fp32_experts_and_checkpoint_in_their_format(tmp_path):
    masters, fp32 = tmp_path / "masters", tmp_path / "fp32"
    dtypes = run_on_ranks(2, _train_with_or_without_masters, str(masters), True, EP2_ON_2 + SAVING)[0]
    fp32_dtypes = run_on_ranks(2, _train_with_or_without_masters, str(fp32), False, EP2_ON_2 + SAVING)[0]
    assert dtypes[EXPERT] == torch.bfloat16 and fp32_dtypes[EXPERT] == torch.float32
    assert dtypes["layers.0.attention.wq.weight"] == torch.float32  # FSDP's, which FSDP casts
    # Bit for bit: the bf16 weights are the masters' rounding, as the casts were; the gradients
    # are the same bf16 products, widened exactly; AdamW steps the same fp32 values.
    steps = _numbers(read_records(masters))
    assert steps == _numbers(read_records(fp32)) and [r["step"] for r in steps] == [1, 2, 3]
    # One checkpoint format: the experts' fp32 masters under their own names and no optimizer
    # master entry, as fp32 experts save them (which resume where the experts are FSDP units:
    # test_moe_trainer.py's ep 2 checkpoint test).
    saved = _saved(masters, 2)
    assert saved[f"model.{EXPERT}"][1] == torch.float32 and not any(k.endswith(".master") for k in saved)
    assert saved == _saved(fp32, 2)
    # Either checkpoint resumes with masters exactly: nothing was rounded on the way.
    assert _resume(masters, "again") == steps[2:]
    assert _resume(fp32, "with_masters") == steps[2:]
    # A model-only start from the masters checkpoint (the optimizer part not loaded): the masters
    # come from the model part exactly, as fp32 experts do (a bf16 copy would round them).
    start = ["--checkpoint.enable", "true", "--checkpoint.initial_load_path",
             str(masters / "checkpoints" / step_folder_name(2))]
    for name, keep in (("start_masters", True), ("start_fp32", False)):
        run_on_ranks(2, _train_with_or_without_masters, str(tmp_path / name), keep, EP2_ON_2 + start)
    assert _numbers(read_records(tmp_path / "start_masters")) == _numbers(read_records(tmp_path / "start_fp32"))
