"""The S3 side against a local moto server: object keys that leave the download folder, credentials
in the endpoint URL, and a resume from an earlier step with later steps in the bucket."""

from __future__ import annotations

import json

import pytest

from kenotron.checkpoint import MARKER_NAME, RemoteStorageError
from kenotron.checkpoint.remote import S3Store, redact_url
from kenotron.config import JobConfig, config_to_toml
from tests.checkpoint.test_remote import BUCKET, remote_keys, s3  # noqa: F401  (s3 is a fixture)
from tests.checkpoint.tiny import make_run, run_layout

boto3 = pytest.importorskip("boto3")


def test_an_object_key_that_leaves_the_download_folder_is_refused_and_nothing_is_written(s3, tmp_path):  # noqa: F811
    client = boto3.client("s3", endpoint_url=s3)
    marker = {"format": "kenotron-dcp/2", "step": 5, "parts": ["model"], "model_only": True}
    client.put_object(Bucket=BUCKET, Key="run/step-000005/" + MARKER_NAME, Body=json.dumps(marker).encode())
    client.put_object(Bucket=BUCKET, Key="run/step-000005/../../../escaped.txt", Body=b"planted")
    local = tmp_path / "a" / "b" / "ckpt"
    *_, manager, _, _ = make_run("single", local, remote_folder=f"s3://{BUCKET}/run", remote_endpoint_url=s3,
                                 load_step=5)
    with pytest.raises(RemoteStorageError, match=r"refusing to download s3://kenotron-test/run/step-000005/\.\./\.\./"
                                                 r"\.\./escaped.txt: its name .* would be written outside"):
        manager.load()
    assert not list(tmp_path.rglob("escaped.txt"))


def test_credentials_in_the_endpoint_url_never_reach_messages_or_the_saved_config(s3, tmp_path, monkeypatch):  # noqa: F811
    endpoint = "http://someone:s3cr3t@127.0.0.1:9"  # nothing listens on port 9
    # One attempt: botocore's retries of the refused connection (seconds of backoff) end in the
    # same error, whose message is what is checked.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    store = S3Store(f"s3://{BUCKET}/x", endpoint)
    (tmp_path / "step-000001").mkdir()
    (tmp_path / "step-000001" / MARKER_NAME).write_text("{}")
    with pytest.raises(RemoteStorageError) as failure:
        store.upload_step(tmp_path / "step-000001")
    assert "s3cr3t" not in str(failure.value)
    cfg = JobConfig()
    cfg.checkpoint.remote_endpoint_url = endpoint
    saved = redact_url(config_to_toml(cfg))
    assert 'remote_endpoint_url = "http://***@127.0.0.1:9"' in saved and "s3cr3t" not in saved


def test_resuming_an_earlier_step_sets_the_later_remote_steps_aside_too(s3, tmp_path):  # noqa: F811
    remote = {"remote_folder": f"s3://{BUCKET}/run", "remote_endpoint_url": s3}
    run_layout("single", tmp_path, until=4, save_at=(2, 4), **remote)
    run_layout("single", tmp_path, until=3, save_at=(3,), load=True, load_step=2, **remote)
    keys = remote_keys(s3, "run/")
    assert f"run/step-000004/{MARKER_NAME}" not in keys
    assert any(k.startswith("run/abandoned-") and k.endswith(f"/step-000004/{MARKER_NAME}") for k in keys)
    assert S3Store(f"s3://{BUCKET}/run", s3).complete_steps() == [2, 3]
