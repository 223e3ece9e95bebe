"""Which checkpoints a run keeps, deletes, sets aside and resumes from (issue: never lose a run)."""

from __future__ import annotations

import json

import pytest
import torch

from kenotron.checkpoint import MARKER_NAME, CheckpointError, list_step_folders
from kenotron.checkpoint.folders import STAMP_NAME
from tests.checkpoint.tiny import make_run, run_layout


def steps_on_disk(folder) -> list[tuple[int, bool]]:
    return [(f.step, f.complete) for f in list_step_folders(folder)]


def abandoned_steps(folder) -> list[str]:
    return sorted(p.name for d in folder.glob("abandoned-*") for p in d.iterdir())


def test_resuming_an_earlier_step_sets_the_later_ones_aside_and_rotates_by_this_runs_own_saves(tmp_path):
    run_layout("single", tmp_path, until=6, save_at=(2, 4, 6))
    run_layout("single", tmp_path, until=5, save_at=(4, 5), load=True, load_step=2, keep_latest_k=2)
    assert steps_on_disk(tmp_path) == [(4, True), (5, True)]  # the earlier run's 4 and 6 did not count
    assert abandoned_steps(tmp_path) == ["step-000004", "step-000006"]  # moved, not deleted
    *_, state, manager, _, _ = make_run("single", tmp_path)
    assert manager.load() == 5 and state.step == 5  # the restart continues this run, not step 6


def test_starting_afresh_in_a_used_folder_sets_every_earlier_checkpoint_aside(tmp_path):
    run_layout("single", tmp_path, until=4, save_at=(2, 4))
    *_, manager, _, _ = make_run("single", tmp_path, load_step=0)
    assert manager.load() is None
    assert steps_on_disk(tmp_path) == [] and abandoned_steps(tmp_path) == ["step-000002", "step-000004"]
    manager.save(1)
    manager.close()
    *_, manager, _, _ = make_run("single", tmp_path)
    assert manager.load() == 1


def test_a_step_folder_kenotron_did_not_write_is_never_deleted(tmp_path):
    foreign = tmp_path / "step-000001"
    foreign.mkdir(parents=True)
    (foreign / "weights.bin").write_bytes(b"another trainer's data")
    run_layout("single", tmp_path, until=3, save_at=(2, 3), keep_latest_k=1)
    assert (foreign / "weights.bin").read_bytes() == b"another trainer's data"
    assert steps_on_disk(tmp_path) == [(1, False), (3, True)]


def test_a_foreign_step_folder_where_the_run_will_save_is_refused_before_training(tmp_path):
    foreign = tmp_path / "step-000003"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    *_, manager, _, _ = make_run("single", tmp_path)
    with pytest.raises(CheckpointError, match=r"holds step-000003, not written by kenotron .* Move them out"):
        manager.load()
    assert (foreign / "notes.txt").read_text() == "mine"


def test_an_interrupted_save_of_kenotron_is_cleaned_up_by_the_next_save(tmp_path):
    debris = tmp_path / "step-000001"
    debris.mkdir(parents=True)
    (debris / STAMP_NAME).write_text("{}")  # killed right after it started
    run_layout("single", tmp_path, until=2, save_at=(2,))
    assert steps_on_disk(tmp_path) == [(2, True)]


def test_a_model_only_export_never_counts_toward_rotation_nor_is_resumed_from(tmp_path):
    *_, state, manager, _, _ = make_run("single", tmp_path, interval=2, keep_latest_k=1, last_save_model_only=True)
    for step in range(1, 6):
        state.step = step
        manager.maybe_save(step, last=step == 5)
    manager.close()
    assert steps_on_disk(tmp_path) == [(4, True), (5, True)]
    assert json.loads((tmp_path / "step-000005" / MARKER_NAME).read_text())["model_only"]
    *_, state, manager, _, _ = make_run("single", tmp_path, interval=2, keep_latest_k=1)
    assert manager.load() == 4 and state.step == 4  # the full checkpoint, not the export
    # The export lies above the step the run continues from: set aside with the abandoned branch.
    assert abandoned_steps(tmp_path) == ["step-000005"]


def test_a_resume_with_the_step_counter_left_fresh_sets_aside_everything_above_step_zero(tmp_path):
    run_layout("single", tmp_path, until=4, save_at=(2, 4))
    *_, state, manager, _, _ = make_run("single", tmp_path, exclude_from_loading=["train_state"])
    assert manager.load() == 4 and state.step == 0
    assert steps_on_disk(tmp_path) == [] and abandoned_steps(tmp_path) == ["step-000002", "step-000004"]


def test_weights_holding_nan_are_never_saved(tmp_path):
    run_layout("single", tmp_path, until=1, save_at=(1,))
    model, *_, manager, _, _ = make_run("single", tmp_path)
    with torch.no_grad():
        next(model.parameters())[0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not saving step-000002: the run.s state holds NaN or Inf "
                                              r"\(parameter tok_embeddings.weight\).*"
                                              r"the latest complete checkpoint is still step-000001"):
        manager.save(2)
    assert steps_on_disk(tmp_path) == [(1, True)]


def link_to_other_runs_checkpoint(tmp_path, step: int, linked_as: int):
    """Another run (`other/`) with a complete checkpoint of `step`, linked from this run's folder
    (`run/`) as step `linked_as`; returns (other's step folder, this run's folder)."""
    other = tmp_path / "other"
    run_layout("single", other, until=step, save_at=(step,))
    run = tmp_path / "run"
    run.mkdir()
    (run / f"step-{linked_as:06d}").symlink_to(other / f"step-{step:06d}", target_is_directory=True)
    return other / f"step-{step:06d}", run


def test_rotation_removes_a_link_to_another_runs_checkpoint_never_its_marker(tmp_path, caplog):
    target, run = link_to_other_runs_checkpoint(tmp_path, step=2, linked_as=2)
    marker = (target / MARKER_NAME).read_text()
    run_layout("single", run, until=4, save_at=(3, 4), load=True, keep_latest_k=1)  # resumes through the link
    assert (target / MARKER_NAME).read_text() == marker  # the other run's step 2 is still complete
    assert steps_on_disk(tmp_path / "other") == [(2, True)]
    assert steps_on_disk(run) == [(4, True)] and not (run / "step-000002").is_symlink()
    assert "is a symbolic link" in caplog.text and "removed the link only" in caplog.text
    *_, state, manager, _, _ = make_run("single", tmp_path / "other")
    assert manager.load() == 2 and state.step == 2


def test_an_interrupted_save_behind_a_link_is_unlinked_not_emptied(tmp_path):
    other = tmp_path / "other" / "step-000005"
    other.mkdir(parents=True)
    (other / STAMP_NAME).write_text("{}")
    (other / "notes.txt").write_text("the other run's")
    run = tmp_path / "run"
    run.mkdir()
    (run / "step-000005").symlink_to(other, target_is_directory=True)
    run_layout("single", run, until=6, save_at=(6,))  # the save of step 6 cleans up older debris
    assert (other / "notes.txt").read_text() == "the other run's" and (other / STAMP_NAME).is_file()
    assert steps_on_disk(run) == [(6, True)]


def test_setting_aside_a_link_moves_the_link_and_leaves_what_it_points_to(tmp_path):
    target, run = link_to_other_runs_checkpoint(tmp_path, step=4, linked_as=4)
    run_layout("single", run, until=2, save_at=(2,))
    *_, manager, _, _ = make_run("single", run, load_step=2)
    assert manager.load() == 2
    assert abandoned_steps(run) == ["step-000004"]
    assert next(run.glob("abandoned-*/step-000004")).is_symlink()
    assert (target / MARKER_NAME).is_file() and steps_on_disk(tmp_path / "other") == [(4, True)]


def test_the_records_of_an_abandoned_continuation_are_kept_beside_its_checkpoints(tmp_path):
    from kenotron.checkpoint.resume import abandon_later
    from kenotron.config import load_config
    from kenotron.runtime.run_folder import start_run_folder

    run = tmp_path / "run"
    cfg = load_config(None, ["--job.dump_folder", str(run), "--checkpoint.enable", "true"])
    run_layout("single", run / "checkpoints", until=6, save_at=(2, 4, 6))
    lines = [json.dumps({"step": s, "loss": 9.0 - s}) for s in range(1, 8)]
    (run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    abandon_later(run / "checkpoints", 2, None)  # what a resume with checkpoint.load_step 2 does
    start_run_folder(cfg, 2)
    assert (run / "metrics.jsonl").read_text().splitlines() == lines[:2]
    aside = next((run / "checkpoints").glob("abandoned-*"))
    assert (aside / "metrics.jsonl").read_text().splitlines() == lines[2:]
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.jsonl", "step-000004", "step-000006"]
