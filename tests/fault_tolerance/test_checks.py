"""The [fault_tolerance] section is refused in one line naming the value and the fix, before
any process starts; torchft's availability is said in one line naming the versions."""

from __future__ import annotations

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.fault_tolerance.checks import check_fault_tolerance
from kenotron.fault_tolerance.torchft_import import _version_tuple, unavailable_reason


def _cfg(*overrides: str):
    return load_config(None, ["--fault_tolerance.enable", "true", "--fault_tolerance.lighthouse",
                              "http://localhost:29510", *overrides])


@pytest.mark.parametrize(("overrides", "message"), [
    (["--fault_tolerance.replica_id", "2"], "fault_tolerance.replica_id=2 must be below fault_tolerance.replica_groups=2"),
    (["--fault_tolerance.min_replicas", "3"], "fault_tolerance.min_replicas=3 is more than the 2 replica groups"),
    (["--parallelism.dp_replicate", "2"], "set parallelism.dp_replicate=1 and fault_tolerance.replica_groups=4"),
    (["--parallelism.dp_mode", "zero1"], "use dp_mode \"fsdp\" inside each group"),
])
def test_a_fault_tolerance_section_that_cannot_run_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_fault_tolerance(_cfg(*overrides))


def test_a_group_without_a_lighthouse_is_told_how_to_start_one(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="torchft_lighthouse --min_replicas 1"):
        check_fault_tolerance(_cfg("--fault_tolerance.lighthouse", ""))
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:29510")
    check_fault_tolerance(_cfg("--fault_tolerance.lighthouse", ""))


def test_a_disabled_section_is_not_checked():
    check_fault_tolerance(load_config(None, ["--fault_tolerance.replica_id", "7"]))


def test_torchft_versions_compare_by_major_and_minor():
    assert _version_tuple("0.2.0") == (0, 2) and _version_tuple("0.10.1rc1") == (0, 10)
    assert _version_tuple("0.1.9") < (0, 2)


def test_a_torchft_older_than_the_api_kenotron_uses_is_refused_naming_both_versions(monkeypatch):
    import torch

    from kenotron.fault_tolerance import torchft_import

    monkeypatch.setattr(torchft_import, "torchft_version", lambda: "0.1.0")
    reason = unavailable_reason()
    assert reason == (f"torchft 0.1.0 is older than 0.2.0, whose API kenotron uses: pip install 'torchft>=0.2.0' "
                      f"(torch {torch.__version__})")
    monkeypatch.setattr(torchft_import, "torchft_version", lambda: None)
    assert "pip install 'kenotron[ft]'" in unavailable_reason()


def test_a_trainer_started_without_the_launchers_rank_program_refuses_fault_tolerance(tmp_path):
    from kenotron.train.trainer import Trainer

    cfg = _cfg("--model.n_layers", "1", "--training.device", "cpu", "--job.dump_folder", str(tmp_path))
    with pytest.raises(ConfigError, match="needs the launcher's rank program"):
        Trainer(cfg)
