"""No checkpoint is written with, or resumed from, NaN or Inf state (kenotron/checkpoint/finite.py):
parameters, persistent buffers (an MoE router's expert_bias) and optimizer state (issue 35, item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kenotron.checkpoint import CheckpointManager, NonFiniteCheckpointError, NonFiniteStateError, list_step_folders
from kenotron.checkpoint.model_info import describe_model
from kenotron.config.sections import Checkpoint
from kenotron.models import get_model_spec
from tests.checkpoint.tiny import make_run, run_layout

NAN = torch.tensor([float("nan")], dtype=torch.float32).numpy().tobytes()


def moe_run(folder: Path, **config):
    """(model, optimizer, manager) of a tiny Qwen3-MoE whose routers carry distinct expert biases."""
    spec = get_model_spec("qwen3_moe")
    args = spec.model_args("debug", n_layers=1, dim=64, n_heads=2, n_kv_heads=1, head_dim=32, vocab_size=256,
                           max_seq_len=16)
    with torch.device("meta"):
        model = spec.build(args)
    model.to_empty(device="cpu")
    model.init_weights(buffer_device="cpu", seed=0)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(torch.linspace(0.137, 0.911, buffer.numel()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    manager = CheckpointManager(Checkpoint(enable=True, **config), folder, model_parts=[model], optimizers=[optimizer],
                                model_info=describe_model(spec, model.args, "tiny-moe"))
    return model, optimizer, manager


def flip_to_nan(step_folder: Path, values: torch.Tensor) -> None:
    """Overwrite the first element of `values` where its bytes sit in the step's data files, as a
    flipped bit would (same size, so only checksums could tell)."""
    needle = values.detach().float().contiguous().numpy().tobytes()[:64]
    for file in sorted(step_folder.glob("*.distcp")):
        data = bytearray(file.read_bytes())
        at = data.find(needle)
        if at >= 0:
            data[at:at + 4] = NAN
            file.write_bytes(bytes(data))
            return
    raise AssertionError(f"the bytes of the tensor were not found in {step_folder}")


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of the latest checkpoint in `folder`, as a fresh run loads them."""
    model, *_, manager, _, _ = make_run("single", folder)
    manager.load()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_nan_in_a_routers_expert_bias_buffer_is_never_saved(tmp_path):
    model, _, manager = moe_run(tmp_path)
    manager.save(1)
    manager.wait()
    with torch.no_grad():
        model.layers["0"].feed_forward.router.expert_bias[3] = float("nan")
    with pytest.raises(NonFiniteCheckpointError, match=r"not saving step-000002: .*\(buffer layers\.0\.feed_forward\.router\."
                                                       r"expert_bias\).* still step-000001"):
        manager.save(2)
    assert [(f.step, f.complete) for f in list_step_folders(tmp_path)] == [(1, True)]


def test_a_nan_in_the_optimizer_state_is_never_saved(tmp_path):
    model, optimizer, *_, manager, _, _ = make_run("single", tmp_path)
    run_layout("single", tmp_path, until=1, save_at=(1,))
    assert manager.load() == 1
    weight = model.layers["0"].attention.wq.weight
    optimizer.state[weight]["exp_avg_sq"][0, 0] = float("inf")
    with pytest.raises(NonFiniteCheckpointError,
                       match=r"\(optimizer state exp_avg_sq of layers\.0\.attention\.wq\.weight\), training diverged"):
        manager.save(2)


def test_a_bit_flipped_weight_without_checksums_is_refused_on_load_naming_the_step_and_the_tensor(tmp_path):
    run_layout("single", tmp_path, until=2, save_at=(1, 2), checksums=False)
    flip_to_nan(tmp_path / "step-000002", saved_weights(tmp_path)["layers.1.feed_forward.w2.weight"])
    *_, manager, _, _ = make_run("single", tmp_path, checksums=False)
    with pytest.raises(NonFiniteStateError) as err:
        manager.load()
    assert str(err.value).startswith("step-000002 (")
    assert "(parameter layers.1.feed_forward.w2.weight)" in str(err.value)
    assert "not resumed from; resume from an earlier step (--checkpoint.load_step 1)" in str(err.value)
    assert "\n" not in str(err.value)
    *_, state, manager, _, _ = make_run("single", tmp_path, load_step=1, checksums=False)
    assert manager.load() == 1 and state.step == 1  # the step it names loads


def test_a_nan_expert_bias_in_a_checkpoint_is_refused_on_load(tmp_path):
    model, _, manager = moe_run(tmp_path, checksums=False)
    manager.save(1)
    manager.wait()
    flip_to_nan(tmp_path / "step-000001", model.layers["0"].feed_forward.router.expert_bias)
    _, _, manager = moe_run(tmp_path, checksums=False)
    with pytest.raises(NonFiniteStateError, match=r"^step-000001 .*\(buffer layers\.0\.feed_forward\.router\.expert_bias\)"):
        manager.load()
