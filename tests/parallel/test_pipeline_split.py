"""Pipeline splits as data: balanced and explicit splits, stage placement, printing, and the
bad inputs that must stop a run before any process group exists."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kenotron import degrees
from kenotron.config import load_config
from kenotron.degrees import ParallelConfigError
from kenotron.models import get_model_spec
from kenotron.parallel.pipeline import (
    PipelineSplit,
    balanced_layer_counts,
    build_pipeline_split,
    stage_module,
)
from kenotron.train.resolve import resolve_run


def meta_model(name: str = "llama3", n_layers: int = 4):
    spec = get_model_spec(name)
    with torch.device("meta"):
        return spec.build(spec.model_args("debug", n_layers=n_layers))


@pytest.mark.parametrize(
    "args, counts",
    [
        ((4, 2, 1.0, 1.0), [2, 2]),
        ((16, 4, 0.0, 0.0), [4, 4, 4, 4]),
        ((16, 4, 1.0, 1.0), [3, 5, 5, 3]),  # embedding and norm+output cost one block each
        ((8, 2, 3.0, 0.0), [2, 6]),  # a heavy embedding leaves the first stage fewer blocks
        ((8, 8, 1.0, 1.0), [1] * 8),  # never fewer than one block
    ],
)
def test_balanced_layer_counts(args, counts):
    assert balanced_layer_counts(*args) == counts


def test_default_split_puts_edges_on_first_and_last_stage():
    split = build_pipeline_split(meta_model(), pp=2, schedule="1F1B", local_batch_size=4)
    assert split.stages == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "output"]]
    assert split.microbatches == 4 and split.tied_parameters == []


def test_explicit_layers_and_modules():
    model = meta_model()
    by_count = build_pipeline_split(model, pp=2, schedule="GPipe", local_batch_size=2, layers_per_stage=[1, 3])
    assert by_count.stages[0] == ["tok_embeddings", "layers.0"]
    modules = [["tok_embeddings", "layers.0", "layers.1", "layers.2"], ["layers.3", "norm", "output"]]
    by_name = build_pipeline_split(model, pp=2, schedule="GPipe", local_batch_size=2, stage_modules=modules)
    assert by_name.stages == modules


def test_stage_placement_looped_and_v():
    looped = PipelineSplit([["a"]] * 8, pp=4, schedule="Interleaved1F1B")
    assert [looped.local_stages(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    v = PipelineSplit([["a"]] * 8, pp=4, schedule="ZBVZeroBubble")
    assert [v.local_stages(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]


def test_stage_module_keeps_names_and_drops_the_rest():
    model = meta_model()
    last = stage_module(model, ["layers.2", "layers.3", "norm", "output"])
    names = {n for n, _ in last.named_parameters()}
    assert "layers.2.attention.wq.weight" in names and "output.weight" in names
    assert last.tok_embeddings is None and "layers.0.attention.wq.weight" not in names
    assert len(list(model.layers)) == 4  # the whole model is left as it was


def test_tied_embeddings_are_found_across_stages():
    split = build_pipeline_split(meta_model("qwen2"), pp=2, schedule="1F1B", local_batch_size=2)
    assert split.tied_parameters == [["tok_embeddings.weight", "output.weight"]]


def test_plan_prints_its_stages():
    cfg = load_config(None, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble",
                             "--training.local_batch_size", "4", "--model.n_layers", "4"])
    text = str(resolve_run(cfg, 2).plan)
    assert "pipeline: ZBVZeroBubble, 4 stages on 2 ranks, 4 microbatches" in text
    assert "stage 0 (pp rank 0): tok_embeddings, layers.0" in text
    assert "stage 3 (pp rank 0): layers.3, norm, output" in text


BAD = {
    "fewer_layers_than_stages": (
        4, ["--parallelism.pp", "4", "--model.n_layers", "2"], "only 2 layers"),
    "fewer_layers_than_virtual_stages": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "Interleaved1F1B", "--model.n_layers", "3"],
        "4 pipeline stages but the model has only 3 layers"),
    "microbatches_not_dividing_batch": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_microbatches", "3", "--training.local_batch_size", "4"],
        "pp_microbatches=3 does not divide training.local_batch_size=4"),
    "v_schedule_odd_stage_count": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "DualPipeV", "--parallelism.pp_layers_per_stage",
            "1,1,2"], "the split has 3 (an odd count cannot fold into a V)"),
    "too_few_microbatches_for_1f1b": (
        4, ["--parallelism.pp", "4", "--training.local_batch_size", "2"], "1F1B needs at least 4 microbatches"),
    "layers_per_stage_wrong_total": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_layers_per_stage", "1,2"], "add up to the model's 4 layers"),
    "stage_modules_out_of_order": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_stage_modules",
            "tok_embeddings layers.1 layers.0, layers.2 layers.3 norm output"], "in forward order"),
    "stage_modules_unknown": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_stage_modules", "embed layers.0 layers.1, layers.2 layers.3 norm output"],
        "'embed' is not a unit of the model"),
    "fused_loss": (2, ["--parallelism.pp", "2", "--tuning.loss", "fused"], "tuning.loss='fused' does not combine"),
    "zero_bubble_with_compile": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble", "--compile.enable", "true"],
        "compiled blocks do not support"),
    # It failed at the first step before (torch: "Trying to backward an extra time").
    "zero_bubble_with_selective_ac": (
        2, ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble",
            "--activation_checkpoint.mode", "selective-op"], "activation_checkpoint.mode='selective-op' cannot"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_pipeline_config_fails_before_any_process_group(case):
    world, overrides, message = BAD[case]
    cfg = load_config(None, ["--model.n_layers", "4", "--training.local_batch_size", "4"] + overrides)
    with pytest.raises(ValueError) as info:
        resolve_run(cfg, world)
    assert message in str(info.value), str(info.value)
    assert not dist.is_initialized()


def test_bad_split_errors_are_parallel_config_errors():
    with pytest.raises(ParallelConfigError):
        build_pipeline_split(meta_model(), pp=2, schedule="GPipe", local_batch_size=2, layers_per_stage=[1, 1, 2])


@pytest.mark.parametrize("release,refused", [((2, 11), True), ((2, 13), False)])
def test_zero_bubble_schedules_with_routed_experts_are_refused_before_torch_2_13(monkeypatch, release, refused):
    # torch 2.11 on GPU, deepseek_v3 debug, ZBVZeroBubble: "Attribute '_input_metadata' is invalid for this
    # instance of _C._FunctionBase" at the first weight pass (2026-11-28).
    monkeypatch.setattr(degrees, "torch_release", lambda: release)
    cfg = load_config(None, ["--model.name", "qwen3_moe", "--model.n_layers", "4", "--training.local_batch_size", "4",
                             "--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble"])
    if refused:
        with pytest.raises(ParallelConfigError, match=r"torch 2.11 cannot start from the routed experts' custom "
                                                      r"autograd functions; use torch >= 2.13, or a schedule among"):
            resolve_run(cfg, 2)
    else:
        assert resolve_run(cfg, 2).plan.pipeline.schedule == "ZBVZeroBubble"
    dense = load_config(None, ["--model.n_layers", "4", "--training.local_batch_size", "4", "--parallelism.pp", "2",
                               "--parallelism.pp_schedule", "ZBVZeroBubble"])
    assert resolve_run(dense, 2).plan.pipeline.schedule == "ZBVZeroBubble"  # no experts: any torch
