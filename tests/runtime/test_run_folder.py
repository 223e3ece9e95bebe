"""One run, one folder (kenotron/runtime/run_folder.py): a resume keeps every step once in
metrics.jsonl and TensorBoard, a different config never mixes into a used folder, whether the run
starts from the CLI or from `Trainer(cfg)` in a notebook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from kenotron.checkpoint.folders import step_folder_name, write_marker
from kenotron.config import ConfigError, config_to_toml, load_config
from kenotron.runtime.run_folder import check_run_folder, start_run_folder
from kenotron.train import trainer as trainer_module
from kenotron.train.metrics import MetricsLogger
from tests.checkpoint.test_trainer_resume import train


def _cfg(folder: Path, *extra: str):
    return load_config(None, ["--job.dump_folder", str(folder), *extra])


def _fake_run(folder: Path, cfg, steps: list[int], checkpoints: list[int] = ()) -> None:
    """A folder as a launch of `cfg` leaves it: config.toml, records, complete checkpoints."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(config_to_toml(cfg))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 9.0 - s}) + "\n" for s in steps))
    for step in checkpoints:
        path = folder / "checkpoints" / step_folder_name(step)
        path.mkdir(parents=True)
        write_marker(path, {"step": step})


def _steps(folder: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_different_config_on_a_used_folder_is_an_error_naming_the_difference_and_a_free_folder(tmp_path):
    run = tmp_path / "run"
    _fake_run(run, _cfg(run, "--training.steps", "12"), [5, 10, 12])
    with pytest.raises(ConfigError, match=r"training.steps 12 -> 20.*--job.dump_folder .*run-2"):
        check_run_folder(_cfg(run, "--training.steps", "20"))
    with pytest.raises(ConfigError, match=r"checkpoint.enable false -> true"):
        check_run_folder(_cfg(run, "--training.steps", "12", "--checkpoint.enable", "true"))


def test_the_same_config_without_a_checkpoint_restarts_the_run_and_replaces_its_records(tmp_path):
    run = tmp_path / "run"
    cfg = _cfg(run, "--training.steps", "12", "--job.description", "first launch")
    _fake_run(run, cfg, [5, 10, 12])
    again = _cfg(run, "--training.steps", "12", "--job.description", "second launch")
    check_run_folder(again)  # the description is per launch
    assert start_run_folder(again, 0) == 1  # TensorBoard purges every earlier step
    assert _steps(run) == []
    assert 'description = "second launch"' in (run / "config.toml").read_text()


def test_a_resume_must_keep_the_model_and_data(tmp_path):
    run = tmp_path / "run"
    old = _cfg(run, "--checkpoint.enable", "true")
    _fake_run(run, old, [1, 2, 3, 4], checkpoints=[2, 4])
    check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--training.steps", "400"))  # more steps: fine
    with pytest.raises(ConfigError, match=r"another model or data \(model.flavor \"debug\" -> \"1B\"\)"):
        check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--model.flavor", "1B"))
    with pytest.raises(ConfigError, match=r"load_step=0 starts afresh.*checkpoints step-000002, step-000004"):
        check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--checkpoint.load_step", "0"))


def test_a_resume_must_keep_the_model_shape_set_on_top_of_the_flavor(tmp_path):
    run = tmp_path / "run"
    _fake_run(run, _cfg(run, "--checkpoint.enable", "true", "--model.dim", "128"), [1, 2], checkpoints=[2])
    check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--model.dim", "128"))
    with pytest.raises(ConfigError, match=r"another model or data \(model.dim 128 -> 256\)"):
        check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--model.dim", "256"))
    with pytest.raises(ConfigError, match=r"another model or data \(model.dim 128 -> \(flavor\)\)"):
        check_run_folder(_cfg(run, "--checkpoint.enable", "true"))


def test_a_trainer_built_directly_refuses_a_folder_of_another_model_with_the_cli_error(tmp_path):
    run = tmp_path / "run"
    _fake_run(run, _cfg(run, "--checkpoint.enable", "true", "--model.dim", "128"), [1, 2], checkpoints=[2])
    cfg = _cfg(run, "--checkpoint.enable", "true", "--model.dim", "256")
    with pytest.raises(ConfigError) as cli:
        check_run_folder(cfg)
    with pytest.raises(ConfigError, match=r"another model or data \(model.dim 128 -> 256\)") as direct:
        trainer_module.Trainer(cfg)  # the notebook path
    assert str(direct.value) == str(cli.value)
    assert not dist.is_initialized()  # refused before any process group


class _Resolved(Exception):
    """Stops a launch at the first step after the run-folder check."""


def test_the_cli_path_checks_the_run_folder_once(tmp_path, monkeypatch):
    calls = []
    check = trainer_module.check_run_folder
    monkeypatch.setattr(trainer_module, "check_run_folder", lambda cfg: calls.append(cfg) or check(cfg))
    monkeypatch.setattr(trainer_module, "resolve_run", lambda *a, **k: (_ for _ in ()).throw(_Resolved()))
    with pytest.raises(_Resolved):
        trainer_module.run_training(_cfg(tmp_path / "run"))
    assert len(calls) == 1


def test_a_resume_drops_the_records_after_the_resumed_step(tmp_path):
    run = tmp_path / "run"
    cfg = _cfg(run, "--checkpoint.enable", "true")
    _fake_run(run, cfg, [1, 2, 3, 4, 5, 6], checkpoints=[4])
    assert start_run_folder(_cfg(run, "--checkpoint.enable", "true", "--training.steps", "300"), 4) == 5
    assert _steps(run) == [1, 2, 3, 4]
    assert "steps = 300" in (run / "config.toml").read_text()


def _tensorboard_steps(folder: Path, tag: str = "train/loss") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder / "tb"))
    acc.Reload()
    return [(e.step, round(e.value, 4)) for e in acc.Scalars(tag)]


def test_a_resumed_run_shows_every_step_once_in_metrics_and_tensorboard(tmp_path, caplog):
    folder = tmp_path / "run"
    on = ["--checkpoint.enable", "true", "--metrics.tensorboard", "true"]
    train(str(folder), on)  # steps 1-4, checkpoints at 2 and 4
    first = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
    train(str(folder), on + ["--checkpoint.load_step", "2"])  # steps 3-4 again, from step 2
    assert _steps(folder) == [1, 2, 3, 4]
    tb = _tensorboard_steps(folder)
    assert [step for step, _ in tb] == [1, 2, 3, 4]
    assert tb[-1][1] == round(first, 4)  # exact resume: the replayed step has the same loss
    with caplog.at_level("INFO", logger="kenotron"):
        train(str(folder), on)  # resumes at step 4 of 4
    assert "resumed at step 4, and training.steps=4: nothing left to train" in caplog.text
    assert _steps(folder) == [1, 2, 3, 4]


def test_metrics_logger_tells_tensorboard_to_purge_replayed_steps(tmp_path):
    import torch

    def write(steps, loss, purge=None):
        log = MetricsLogger(tmp_path, 1.0, 1, torch.device("cpu"), tensorboard=True)
        log.open(purge)
        for step in steps:
            log.count(10)
            log.record(step=step, loss=loss, grad_norm=1.0, lr=1e-3, tokens_seen=10 * step)
        log.close()

    write(range(1, 7), 5.0)
    write(range(4, 6), 3.0, purge=4)
    assert _tensorboard_steps(tmp_path) == [(1, 5.0), (2, 5.0), (3, 5.0), (4, 3.0), (5, 3.0)]


def test_a_resume_under_another_optimizer_must_leave_its_state_unloaded(tmp_path):
    run = tmp_path / "run"
    _fake_run(run, _cfg(run, "--checkpoint.enable", "true"), [1, 2], checkpoints=[2])
    with pytest.raises(ConfigError, match=r'optimizer.name changed on resume \("adamw" -> "muon"\)'
                                          r".*adding 'optimizer' to checkpoint.exclude_from_loading"):
        check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--optimizer.name", "muon"))
    check_run_folder(_cfg(run, "--checkpoint.enable", "true", "--optimizer.name", "muon",
                          "--checkpoint.exclude_from_loading", "optimizer"))
