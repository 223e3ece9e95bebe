"""Checkpoint copies in an S3-compatible bucket, against a local moto server on 127.0.0.1."""

from __future__ import annotations

import pytest

from kenotron.checkpoint import MARKER_NAME, list_step_folders
from tests.checkpoint.tiny import make_run, run_layout

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

BUCKET = "kenotron-test"


@pytest.fixture
def s3(monkeypatch):
    """An S3 endpoint URL with an empty bucket BUCKET; the server stops after the test."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def remote_keys(endpoint: str, prefix: str) -> list[str]:
    listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def test_uploaded_checkpoints_resume_a_run_whose_local_copies_were_deleted(s3, tmp_path):
    remote = {"remote_folder": f"s3://{BUCKET}/run1", "remote_endpoint_url": s3}
    full = run_layout("single", tmp_path / "full", until=4)
    run_layout("single", tmp_path / "a", until=2, save_at=(1, 2), remote_delete_local=True, **remote)
    assert list_step_folders(tmp_path / "a") == []
    keys = remote_keys(s3, "run1/")
    assert "run1/step-000002/" + MARKER_NAME in keys and "run1/step-000002/.metadata" in keys
    resumed = run_layout("single", tmp_path / "b", until=4, load=True, **remote)
    assert resumed == {3: full[3], 4: full[4]}


def test_missing_bucket_fails_the_upload_clearly_and_keeps_the_local_checkpoint(s3, tmp_path):
    *_, manager, _, _ = make_run("single", tmp_path, remote_folder="s3://no-such-bucket/x", remote_endpoint_url=s3,
                                 remote_delete_local=True)
    manager.save(1)
    manager.save(2)  # training goes on
    manager.close()
    assert [(f.step, f.complete) for f in list_step_folders(tmp_path)] == [(1, True), (2, True)]
    assert len(manager.uploader.failures) == 2
    assert "the bucket 'no-such-bucket' does not exist; create it or fix checkpoint.remote_folder" in \
        manager.uploader.failures[0]
    assert "the local copy" in manager.uploader.failures[0] and "is kept" in manager.uploader.failures[0]


def test_missing_credentials_fail_the_upload_clearly(s3, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    *_, _state, manager, _, _ = make_run("single", tmp_path, remote_folder=f"s3://{BUCKET}/y", remote_endpoint_url=s3)
    manager.save(1)
    manager.close()
    assert "no AWS credentials were found; set AWS_ACCESS_KEY_ID" in manager.uploader.failures[0]
    assert list_step_folders(tmp_path)[0].complete
