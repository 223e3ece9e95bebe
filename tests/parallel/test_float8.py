"""float8 through torchao: which layers convert, and that a converted model trains like the
unconverted one (torchao's float8 linear runs on the CPU through torch's CPU scaled matmul)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from kenotron.config import ConfigError, load_config
from kenotron.models import get_model_spec
from kenotron.parallel import float8
from kenotron.parallel.float8 import check_float8_available, convert_to_float8
from kenotron.train.trainer import run_training

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")


def _debug_llama() -> nn.Module:
    spec = get_model_spec("llama3")
    with torch.device("meta"):
        return spec.build(spec.model_args("debug", max_seq_len=64))


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_converter_swaps_every_block_linear_and_keeps_the_output_projection(recipe):
    model = _debug_llama()
    n_blocks = len(model.layers)
    assert convert_to_float8(model, recipe) == 7 * n_blocks  # wq wk wv wo w1 w2 w3
    from torchao.float8.float8_linear import Float8Linear

    assert type(model.output) is nn.Linear
    assert all(isinstance(m, Float8Linear) for m in model.layers["0"].feed_forward.children())


def test_unknown_recipe_is_refused():
    with pytest.raises(ValueError, match="float8 recipe 'blockwise' is not one of tensorwise, rowwise"):
        convert_to_float8(_debug_llama(), "blockwise")


def test_missing_torchao_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setattr(float8.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"float8.enable=true needs torchao.*pip install 'kenotron\[float8\]'"):
        check_float8_available()


def test_the_trainer_refuses_float8_without_torchao_before_any_process_group(monkeypatch, tmp_path):
    import torch.distributed as dist

    from kenotron.train.trainer import Trainer

    monkeypatch.setattr(float8.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="float8.enable=true needs torchao"):
        Trainer(load_config(None, ["--float8.enable", "true", "--training.device", "cpu",
                                   "--job.dump_folder", str(tmp_path)]))
    assert not dist.is_initialized()


@needs_torchao
def test_float8_training_follows_the_unconverted_loss(tmp_path):
    # Two blocks: every linear of a block is converted alike; the default four took 1.5x the time
    # (measured: loss down 1.38 in 30 steps, float8 within 6e-4 of fp32; 1.42 and 1.8e-2 with four).
    common = ["--model.n_layers", "2", "--training.seq_len", "64", "--training.local_batch_size", "4",
              "--training.steps", "30", "--metrics.log_freq", "5", "--lr_scheduler.warmup_steps", "5"]
    runs = {}
    # oneDNN has only its reference float8 matmul for CPUs with AMX / AVX10 (~250 ms for one
    # 256 x 256 x 256 product, 16 minutes for this test); torch's own CPU _scaled_mm takes 0.5 ms.
    with torch.backends.mkldnn.flags(enabled=False):
        for name, extra in {"fp32": [], "float8": ["--float8.enable", "true"]}.items():
            cfg = load_config(None, common + extra + ["--job.dump_folder", str(tmp_path / name)])
            runs[name] = [r["loss"] for r in run_training(cfg)]
    assert runs["float8"][-1] < runs["float8"][0] - 1.0  # it learns
    for a, b in zip(runs["float8"], runs["fp32"]):
        assert a == pytest.approx(b, rel=0.03)  # float8 rounding, not a different model
    assert runs["float8"] != runs["fp32"]  # the float8 matmuls really ran


def test_float8_on_a_cpu_turns_onednn_off_with_one_warning(caplog):
    from kenotron.parallel.float8 import use_fast_cpu_float8

    before = torch.backends.mkldnn.enabled
    try:
        torch.backends.mkldnn.enabled = True
        with caplog.at_level("WARNING", logger="kenotron"):
            assert use_fast_cpu_float8("cpu")
        assert not torch.backends.mkldnn.enabled
        assert "float8 on a CPU checks numerics only" in caplog.text
        assert not use_fast_cpu_float8("cuda")
    finally:
        torch.backends.mkldnn.enabled = before


def test_float8_experts_pad_groups_to_16_rows_and_are_refused_where_they_cannot_run():
    from kenotron.models.common.moe import MoE, MoEArgs, expert_alignment
    from kenotron.parallel.float8 import check_float8_experts, convert_experts_to_float8

    layer = MoE(64, MoEArgs(n_experts=4, top_k=2, ffn_dim=32))
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="set tuning.expert_kernel=grouped_mm"):
        convert_experts_to_float8(layer)  # the for_loop kernel
    layer.experts.kernel = "grouped_mm"
    assert expert_alignment(layer.experts, x) == 8  # bf16's 16 bytes
    assert convert_experts_to_float8(layer) == 1
    assert expert_alignment(layer.experts, x) == 16 and layer.experts.grouped_mm is float8.float8_grouped_mm
    with pytest.raises(ConfigError, match="float8.experts=true needs float8.enable=true"):
        check_float8_experts(False, True, "grouped_mm", True)
    with pytest.raises(ConfigError, match="tuning.expert_kernel resolves to 'for_loop'"):
        check_float8_experts(True, True, "for_loop", True)
    with pytest.raises(ConfigError, match="has no MoE layer"):
        check_float8_experts(True, True, "grouped_mm", False)
