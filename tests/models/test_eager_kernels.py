"""tuning.eager_kernels: the fused RoPE and SwiGLU gate installed on a model (kenotron/models/common/eager_kernels.py),
the config's refusal under compile, and training with them on CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.models.common.attention import GQAttention
from kenotron.models.common.eager_kernels import use_eager_kernels
from kenotron.models.common.mlp import SwiGLU, silu_mul
from kenotron.models.common.rope import apply_rope
from kenotron.train.resolve import resolve_run


def test_triton_with_compile_is_refused_by_the_config_check():
    cfg = load_config(None, ["--tuning.eager_kernels", "triton", "--compile.enable", "true"])
    with pytest.raises(ConfigError, match="tuning.eager_kernels='triton' is for uncompiled blocks"):
        resolve_run(cfg, 1)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
def test_installed_kernels_replace_rope_and_gate_and_fall_back_to_pytorch_on_cpu_tensors():
    run = resolve_run(load_config(None, []), 1)
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    reference_out = None
    use_eager_kernels(model, "triton")
    attention = [m for m in model.modules() if isinstance(m, GQAttention)]
    gates = [m for m in model.modules() if isinstance(m, SwiGLU)]
    assert attention and all(m.rope_fn is not apply_rope for m in attention)
    assert gates and all(m.silu_mul is not silu_mul for m in gates)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    tokens = torch.randint(0, run.model_args.vocab_size, (2, 16))
    out = model(tokens)
    for m in attention:
        m.rope_fn = apply_rope
    for m in gates:
        m.silu_mul = silu_mul
    reference_out = model(tokens)
    assert torch.equal(out, reference_out)  # CPU tensors take the PyTorch ops


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                    reason="needs a CUDA device and triton")
@pytest.mark.parametrize("ac", ["none", "full", "selective-op"])
def test_training_with_triton_kernels_follows_pytorch_ops_under_every_ac_mode(tmp_path, ac):
    from kenotron.train.trainer import run_training

    common = ["--training.seq_len", "128", "--training.local_batch_size", "4", "--training.steps", "6",
              "--metrics.log_freq", "1", "--training.param_dtype", "bfloat16", "--compile.enable", "false",
              "--activation_checkpoint.mode", ac, "--training.device", "cuda"]
    losses = {}
    for kernels in ("triton", "torch"):
        cfg = load_config(None, common + ["--tuning.eager_kernels", kernels, "--job.dump_folder", str(tmp_path / kernels)])
        losses[kernels] = [r["loss"] for r in run_training(cfg)]
    for a, b in zip(losses["triton"], losses["torch"]):
        assert a == pytest.approx(b, rel=2e-2)
