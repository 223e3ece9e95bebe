"""CheckpointManager in one process: resume, choice of checkpoint, retention, exclusions, export, errors."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future

import pytest
import torch

from kenotron.checkpoint import (
    MARKER_NAME,
    CheckpointError,
    CheckpointFormatError,
    CheckpointManager,
    CheckpointMismatchError,
    list_step_folders,
)
from kenotron.checkpoint.folders import STAMP_NAME
from kenotron.checkpoint.saver import SaveInFlight
from kenotron.config import ConfigError
from kenotron.config.sections import Checkpoint
from kenotron.config.validate import check_checkpoint_config
from tests.checkpoint.tiny import eval_loss, make_run, run_layout, tiny_args


def test_resumed_run_repeats_the_uninterrupted_losses_bitwise(tmp_path):
    full = run_layout("single", tmp_path / "a", until=5)
    run_layout("single", tmp_path / "b", until=2, save_at=(2,))
    resumed = run_layout("single", tmp_path / "b", until=5, load=True)
    assert resumed == {s: full[s] for s in (3, 4, 5)}


def test_every_part_comes_back_after_load(tmp_path):
    model, opt, sched, state, manager, *_ = make_run("single", tmp_path)
    run_layout("single", tmp_path, until=3, save_at=(3,))
    assert manager.load() == 3
    assert state.step == 3 and sched.last_epoch == 3
    assert int(opt.state[next(model.parameters())]["step"]) == 3
    saved = json.loads((tmp_path / "step-000003" / MARKER_NAME).read_text())
    assert saved["parts"] == ["model", "optimizer", "lr_scheduler", "train_state"]
    assert saved["model"]["name"] == "llama3" and saved["model"]["hf_config"]["num_hidden_layers"] == 2


def test_latest_complete_step_is_loaded_and_an_interrupted_save_is_skipped(tmp_path):
    run_layout("single", tmp_path, until=3, save_at=(2, 3))
    (tmp_path / "step-000003" / MARKER_NAME).unlink()  # as if killed before the marker
    *_, state, manager, _, _ = make_run("single", tmp_path)
    assert manager.load() == 2 and state.step == 2


def test_load_step_picks_that_step_and_an_absent_step_lists_the_complete_ones(tmp_path):
    run_layout("single", tmp_path, until=3, save_at=(1, 3))
    *_, manager, _, _ = make_run("single", tmp_path, load_step=2)
    with pytest.raises(CheckpointError, match=r"load_step=2: no complete checkpoint of step 2 .* complete steps: \[1, 3\]"):
        manager.load()
    *_, state, manager, _, _ = make_run("single", tmp_path, load_step=1)
    assert manager.load() == 1 and state.step == 1


def test_load_step_zero_starts_fresh_and_overwrites_on_save(tmp_path):
    run_layout("single", tmp_path, until=2, save_at=(2,))
    *_, state, manager, _, _ = make_run("single", tmp_path, load_step=0)
    assert manager.load() is None and state.step == 0


def test_keep_latest_k_keeps_only_the_newest_complete_checkpoints(tmp_path):
    (tmp_path / "step-000000").mkdir(parents=True)  # debris of a killed save, older than any new one
    (tmp_path / "step-000000" / STAMP_NAME).write_text("{}")  # kenotron stamps a save before writing
    run_layout("single", tmp_path, until=5, save_at=(1, 2, 3, 4, 5), keep_latest_k=2)
    assert [(f.step, f.complete) for f in list_step_folders(tmp_path)] == [(4, True), (5, True)]


def test_excluded_parts_are_not_restored(tmp_path):
    run_layout("single", tmp_path, until=2, save_at=(2,))
    model, opt, sched, state, manager, *_ = make_run("single", tmp_path, exclude_from_loading=["optimizer", "train_state"])
    fresh_weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert manager.load() == 2
    assert state.step == 0 and sched.last_epoch == 2 and not opt.state
    assert any(not torch.equal(fresh_weights[k], v) for k, v in model.state_dict().items())


def test_model_only_export_in_bfloat16_loads_weights_only(tmp_path):
    model, _opt, _sched, _state, manager, *_ = make_run("single", tmp_path)
    manager.save_model_only(7, torch.bfloat16)
    marker = json.loads((tmp_path / "step-000007" / MARKER_NAME).read_text())
    assert marker["model_only"] and marker["dtype"] == "bfloat16" and marker["parts"] == ["model"]
    other, _, _, other_state, other_manager, *_ = make_run("single", tmp_path / "x", initial_load_path=str(tmp_path / "step-000007"))
    for p in other.parameters():
        p.data.zero_()
    assert other_manager.load() == 7 and other_state.step == 0
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        torch.testing.assert_close(b, a.to(torch.bfloat16).float(), msg=name)


def test_last_save_model_only_writes_an_export_at_the_last_step(tmp_path):
    *_, manager, _, _ = make_run("single", tmp_path, last_save_model_only=True, export_dtype="float16", interval=10)
    assert manager.maybe_save(3) is None
    manager.maybe_save(4, last=True)
    assert json.loads((tmp_path / "step-000004" / MARKER_NAME).read_text())["dtype"] == "float16"


def test_a_different_vocabulary_names_the_embedding_as_the_first_mismatch(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    *_, manager, _, _ = make_run("single", tmp_path, arg_changes={"vocab_size": 512})
    message = (r"parameter 'tok_embeddings.weight' has shape \(256, 256\) in checkpoint .*step-000001 "
               r"\(saved with name=llama3, flavor=tiny-test\) but \(512, 256\) here \(first of 6 mismatching "
               r"tensors\)\. The checkpoint's model has vocab_size=256, this run's vocab_size=512: set model.vocab_size=256$")
    with pytest.raises(CheckpointMismatchError, match=message):
        manager.load()


@pytest.mark.parametrize("n_layers, message", [
    (3, (r"has no parameter 'layers.2.attention_norm.weight' and \d+ more \(the checkpoint's model has n_layers=2, "
         r"this run's n_layers=3: set model.n_layers=2\)")),
    (1, (r"has parameter 'layers.1.attention_norm.weight' and \d+ more that the model here lacks; the checkpoint's "
         r"model has n_layers=2, this run's n_layers=1: set model.n_layers=2$")),
])
def test_a_different_depth_names_the_first_missing_or_extra_layer(tmp_path, n_layers, message):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    *_, manager, _, _ = make_run("single", tmp_path, arg_changes={"n_layers": n_layers}, exclude_from_loading=["optimizer"])
    with pytest.raises(CheckpointMismatchError, match=message):
        manager.load()


def test_a_checkpoint_of_other_model_settings_is_refused_naming_each_differing_key(tmp_path):
    # Same shapes, other RoPE base and norm epsilon: the weights would load into a model that
    # computes something else (a checkpoint of rope_theta 10000 into a run built with 500000).
    run_layout("single", tmp_path, until=1, save_at=(1,), checksums=False)
    saved = tiny_args()
    *_, manager, _, _ = make_run("single", tmp_path, arg_changes={"rope_theta": 500000.0, "norm_eps": 1e-6})
    with pytest.raises(CheckpointMismatchError) as err:
        manager.load()
    assert str(err.value).endswith(
        f"was saved from another model than this run builds: the checkpoint's model has norm_eps={saved.norm_eps!r}, "
        f"rope_theta={saved.rope_theta!r}, this run's norm_eps=1e-06, rope_theta=500000.0: set "
        f"model.norm_eps={saved.norm_eps!r}, model.rope_theta={saved.rope_theta!r} (TOML [model] or --model.<key>) "
        f"to load it, or load a checkpoint of this model")
    *_, state, manager, _, _ = make_run("single", tmp_path, arg_changes={"max_seq_len": 64})
    assert manager.load() == 1 and state.step == 1  # the RoPE tables' length is the run's own


def test_truncated_data_file_is_reported_with_its_name(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    data = next((tmp_path / "step-000001").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:1000])
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=rf"is truncated: data file {data.name} has 1000 bytes but the metadata needs \d+"):
        manager.load()


def test_missing_metadata_is_reported_as_truncated(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    (tmp_path / "step-000001" / ".metadata").unlink()
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"has a completion marker but no .metadata: the folder is truncated"):
        manager.load()


@pytest.mark.parametrize("content, message", [
    (None, r"not a kenotron checkpoint \(no completion marker, no DCP .metadata\)"),
    ('{"format": "other-tool/3"}', r"has format 'other-tool/3', expected 'kenotron-dcp/\d'"),
    ("{not json", r"is not valid JSON"),
])
def test_foreign_folder_gives_a_clear_error(tmp_path, content, message):
    folder = tmp_path / "foreign"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\0" * 10)
    if content is not None:
        (folder / MARKER_NAME).write_text(content)
    *_, manager, _, _ = make_run("single", tmp_path / "run")
    with pytest.raises(CheckpointFormatError, match=message):
        manager.load_from(folder)


def test_folder_with_dcp_files_but_no_marker_is_called_interrupted(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    (tmp_path / "step-000001" / MARKER_NAME).unlink()
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointFormatError, match=r"no completion marker: the save was interrupted"):
        manager.load_from(tmp_path / "step-000001")


def test_thread_async_save_holds_the_state_of_its_step_while_training_goes_on(tmp_path):
    full = run_layout("single", tmp_path / "a", until=4)
    run_layout("single", tmp_path / "b", until=4, save_at=(2,), async_mode="async")
    resumed = run_layout("single", tmp_path / "b", until=4, load=True)
    assert resumed == {3: full[3], 4: full[4]}


def test_pinned_memory_mode_without_a_process_group_says_how_to_launch(tmp_path):
    with pytest.raises(CheckpointError, match=r"writes from a separate process that joins a process group, but none "
                                              r"is initialized; launch with torchrun"):
        make_run("single", tmp_path, async_mode="async_with_pinned_mem")


def test_loss_after_load_equals_the_saved_models_loss(tmp_path):
    model, *_ , manager, _, _ = make_run("single", tmp_path)
    manager.save(1)
    other, *_, other_manager, _, _ = make_run("single", tmp_path)
    for p in other.parameters():
        p.data.normal_()
    other_manager.load()
    assert eval_loss(other, 9) == eval_loss(model, 9)


@pytest.mark.parametrize("change, message", [
    ({"exclude_from_loading": ["optimiser"]}, r"exclude_from_loading has 'optimiser', which is not a part; use some of model, optimizer"),
    ({"remote_folder": "bucket/prefix"}, r"remote_folder='bucket/prefix' must look like s3://bucket/prefix"),
    ({"keep_latest_k": -1}, r"keep_latest_k=-1 must be >= 0"),
    ({"load_step": -2}, r"load_step=-2 must be -1 \(latest\), 0 \(fresh start\) or a step"),
])
def test_bad_checkpoint_settings_are_rejected_with_the_fix(change, message):
    with pytest.raises(ConfigError, match=message):
        check_checkpoint_config(Checkpoint(**change))


def test_disabled_manager_neither_saves_nor_loads(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    model, opt, *_ = make_run("single", tmp_path)
    manager = CheckpointManager(Checkpoint(enable=False, interval=1), tmp_path, model_parts=[model], optimizers=[opt])
    assert manager.load() is None and manager.maybe_save(2) is None
    assert [f.step for f in list_step_folders(tmp_path)] == [1]


class _InterruptedOnce(Future):
    """A write whose first wait is cut by Ctrl-C (a KeyboardInterrupt inside result())."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = True

    def result(self, timeout=None):
        if self.cut:
            self.cut = False
            raise KeyboardInterrupt
        return super().result(timeout)


def test_a_wait_cut_by_ctrl_c_leaves_the_save_in_flight_for_the_next_wait(tmp_path):
    *_, manager, _, _ = make_run("single", tmp_path, async_mode="async")
    written = _InterruptedOnce()

    class HeldSaver:  # the write goes on "in the background" until the test ends it
        def start(self, state, path):
            return SaveInFlight(path, None, written)

        def close(self):
            pass

    manager._saver = HeldSaver()
    path = manager.save(3)
    with pytest.raises(KeyboardInterrupt):  # the training loop's wait, cut by the signal
        manager.wait()
    threading.Timer(0.3, written.set_result, (None,)).start()  # the write ends a moment later
    manager.wait()  # the stop's wait (runtime/interrupt.py) must still wait for it
    assert [f.step for f in list_step_folders(tmp_path) if f.complete] == [3], path
