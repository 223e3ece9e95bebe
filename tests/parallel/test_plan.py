"""Plans as data: build without a process group, print, describe, compare, edit, check, apply."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kenotron.degrees import ParallelDims
from kenotron.dtensor import local_tensor
from kenotron.models import get_model_spec
from kenotron.parallel.dims import build_device_meshes
from kenotron.parallel.model_layout import PlanError
from kenotron.parallel.plan import plan_for
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps

SPEC = get_model_spec("llama3")


def meta_model(flavor: str = "debug", **kw):
    with torch.device("meta"):
        return SPEC.build(SPEC.model_args(flavor, max_seq_len=32, **kw))


def test_plan_prints_a_table_with_every_style():
    text = str(plan_for(SPEC))
    for pattern, style in SPEC.tp_styles.items():
        assert pattern in text and style in text
    assert "data parallel: fsdp" in text and "loss_parallel: True" in text
    assert "layout (the model's structure)" in text and "settings (the run's)" in text


def test_describe_gives_analytic_bytes_per_rank_for_fsdp_and_tp():
    model = meta_model("8B")
    plan = plan_for(SPEC)
    total = sum(p.numel() for p in model.parameters()) * 4
    fsdp = plan.describe(model, {"dp_shard": 8})
    # FSDP 8: every parameter's dim 0 split in 8 (all dims here divide evenly).
    assert sum(r["bytes"] for r in fsdp) == total // 8
    tp = {r["name"]: r for r in plan.describe(model, {"tp": 4})}
    assert tp["layers.0.attention.wq.weight"]["local_shape"] == (1024, 4096)
    assert tp["layers.0.attention.wo.weight"]["local_shape"] == (4096, 1024)
    assert tp["layers.0.attention_norm.weight"]["placements"] == {"tp": "R"}
    assert tp["output.weight"]["placements"] == {"tp": "S(0)"}
    both = plan.describe(model, {"dp_shard": 2, "tp": 4})
    assert both[1]["placements"] == {"dp_shard": "S(0)", "tp": "R"}
    assert "total parameters per rank" in plan.format_description(model, {"dp_shard": 2, "tp": 4})


def test_two_plans_compare_field_by_field():
    a = plan_for(SPEC)
    b = a.copy()
    assert a.diff(b) == [] and a == b
    b.layout.sequence_parallel_off.append("layers.1")
    b.layout.tp_styles["output"] = "colwise"
    b.settings.ac_mode = "full"
    assert a.diff(b) == [
        "layout.tp_styles['output']: output -> colwise",
        "layout.sequence_parallel_off: [] -> ['layers.1']",
        "settings.ac_mode: 'none' -> 'full'",
    ]


def test_a_plan_naming_a_missing_module_is_rejected_with_a_suggestion():
    plan = plan_for(SPEC)
    plan.layout.tp_styles["layers.*.attention.w_q"] = "colwise"
    with pytest.raises(PlanError, match=r"names module 'layers.\*.attention.w_q'.*did you mean 'layers.\*.attention.wq'"):
        plan.check(meta_model())
    plan = plan_for(SPEC)
    plan.layout.fsdp_units = ["blocks.*"]
    with pytest.raises(PlanError, match=r"plan.layout.fsdp_units names module 'blocks.\*'"):
        plan.check(meta_model())


def test_a_plan_with_a_bad_style_or_mode_is_rejected():
    plan = plan_for(SPEC)
    plan.layout.tp_styles["output"] = "diagonal"
    with pytest.raises(PlanError, match=r"tp_styles\['output'\]='diagonal' is not one of"):
        plan.check(meta_model())
    with pytest.raises(PlanError, match=r"parallelism.dp_mode='zero3' is not one of 'fsdp', 'zero1'"):
        plan_for(SPEC, dp_mode="zero3").check(meta_model())
    with pytest.raises(PlanError, match=r"tuning.ac_save_matmul_every=0 must be >= 1"):
        plan_for(SPEC, ac_mode="selective-op", ac_save_matmul_every=0).check(meta_model())
    n_blocks = meta_model().args.n_layers
    with pytest.raises(PlanError, match=rf"activation_checkpoint.offload_blocks={n_blocks + 1} must lie in \[0, {n_blocks}\]"):
        plan_for(SPEC, offload_blocks=n_blocks + 1).check(meta_model())
    assert "offload: first 2 blocks" in str(plan_for(SPEC, offload_blocks=2))


def _applied_local_shapes(mesh_shape: dict[str, int]) -> dict[str, tuple]:
    dims = ParallelDims.from_degrees(dist.get_world_size(), **mesh_shape)
    meshes = build_device_meshes(dims, "cpu")
    model = meta_model()
    plan_for(SPEC).apply(model, meshes)
    return {n: tuple(local_tensor(p).shape) for n, p in model.named_parameters()}


def test_describe_matches_the_shapes_apply_produces_on_rank0():
    mesh_shape = {"dp_shard": 2, "tp": 2}
    described = {r["name"]: r["local_shape"] for r in plan_for(SPEC).describe(meta_model(), mesh_shape)}
    actual = run_on_ranks(4, _applied_local_shapes, mesh_shape)[0]
    assert described == actual


def _sp_off_in_block_1(plan) -> None:
    plan.layout.sequence_parallel_off.append("layers.1")


def test_edited_plan_without_sequence_parallel_in_one_block_still_matches_one_rank(tmp_path):
    reference = run_steps([], str(tmp_path / "ref"))
    overrides = ["--parallelism.tp", "2", "--training.local_batch_size", "8"]
    results = run_on_ranks(2, run_steps, overrides, str(tmp_path), 3, _sp_off_in_block_1)
    # Without SP, block 1's norms stay plain replicated tensors; block 0's are SP DTensors.
    assert "layers.0.attention_norm.weight" in results[0]["dtensor_params"]
    assert "layers.1.attention_norm.weight" not in results[0]["dtensor_params"]
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-6)
