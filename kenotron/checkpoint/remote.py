"""Copies of checkpoint folders in an S3-compatible bucket (AWS S3, MinIO, Ceph, R2, ...).

Remote layout mirrors the local one: `s3://bucket/prefix/step-000100/<files>`, with the
completion marker uploaded last, so a remote step is complete exactly when its marker object
exists, as on disk. boto3 is imported on first use (`pip install "kenotron[s3]"`); credentials
come from boto3's usual sources (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE,
~/.aws/credentials, instance roles).

Uploads run in one background thread. A failed upload (no bucket, no credentials, no network)
is logged with the reason and the fix, and recorded in `failures`; training goes on and the
local checkpoint is kept.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.checkpoint.errors import RemoteStorageError
from kenotron.checkpoint.folders import (
    MARKER_NAME,
    parse_step,
    remove_step_folder,
    step_folder_name,
)

logger = logging.getLogger("kenotron")


def is_remote(location: str) -> bool:
    return location.startswith("s3://")


_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_SECRET_QUERY = re.compile(r"(?i)(?P<key>[?&](?:x-amz-credential|x-amz-signature|x-amz-security-token|"
                           r"awsaccesskeyid|signature|access_key|secret_key|password|token)=)[^&\s\"']+")


def redact_url(text: str) -> str:
    """`text` with the credentials of any URL in it replaced by `***` (user:password@ and
    signature or key query parameters), for logs, error messages and the saved config."""
    text = _USERINFO.sub(lambda m: m.group("scheme") + "***@", text)
    return _SECRET_QUERY.sub(lambda m: m.group("key") + "***", text)


@dataclass(frozen=True)
class S3Location:
    """`s3://bucket/prefix`, split."""

    bucket: str
    prefix: str
    """Key prefix without leading or trailing slash; may be empty."""

    @classmethod
    def parse(cls, url: str) -> S3Location:
        if not is_remote(url):
            raise RemoteStorageError(f"checkpoint.remote_folder={url!r} is not an s3:// URL; use s3://bucket/prefix")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise RemoteStorageError(f"{url!r} names no bucket; use s3://bucket/prefix")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class S3Store:
    """Upload, list and download checkpoint step folders under one `s3://bucket/prefix`."""

    def __init__(self, url: str, endpoint_url: str = "") -> None:
        self.location = S3Location.parse(url)
        self.endpoint_url = endpoint_url or None

    def _client(self) -> Any:
        try:
            import boto3  # optional package (the s3 extra): loaded when an s3:// folder is used
        except ImportError:
            raise RemoteStorageError(
                f"checkpoint.remote_folder={self.location} needs boto3; pip install 'kenotron[s3]' (or boto3)"
            ) from None
        # A session per call: boto3 sessions are not thread-safe, and uploads run in a thread.
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url)

    def upload_step(self, local: Path) -> None:
        """Upload one step folder, its completion marker last."""
        client = self._client()
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MARKER_NAME)
        for file in [*files, local / MARKER_NAME]:
            key = self.location.key(local.name, file.relative_to(local).as_posix())
            self._call(f"uploading {file} to s3://{self.location.bucket}/{key}", client.upload_file,
                       str(file), self.location.bucket, key)

    def complete_steps(self) -> list[int]:
        """Steps whose marker object exists, increasing."""
        client = self._client()
        paginator = client.get_paginator("list_objects_v2")
        prefix = self.location.prefix + "/" if self.location.prefix else ""
        steps = []
        pages = paginator.paginate(Bucket=self.location.bucket, Prefix=prefix, Delimiter="/")
        for page in self._call(f"listing {self.location}", list, pages):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(prefix):].rstrip("/")
                step = parse_step(name)
                if step is not None and self._exists(client, self.location.key(name, MARKER_NAME)):
                    steps.append(step)
        return sorted(steps)

    def download_step(self, step: int, dest_root: Path) -> Path:
        """Download step `step` into `dest_root/step-NNNNNN` (through a temporary folder, marker last)."""
        client = self._client()
        name = step_folder_name(step)
        folder_key = self.location.key(name) + "/"
        listing = client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=folder_key)
        keys = [obj["Key"] for page in self._call(f"listing {self.location}/{name}", list, listing)
                for obj in page.get("Contents", [])]
        if self.location.key(name, MARKER_NAME) not in keys:
            raise RemoteStorageError(
                f"{self.location}/{name} is not a complete checkpoint (no {MARKER_NAME}); pick another step"
            )
        tmp = dest_root / f".{name}.download"
        shutil.rmtree(tmp, ignore_errors=True)
        keys.sort(key=lambda k: k.endswith("/" + MARKER_NAME))  # the marker last
        targets = [safe_target(tmp, key[len(folder_key):], f"s3://{self.location.bucket}/{key}") for key in keys]
        for key, target in zip(keys, targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            self._call(f"downloading s3://{self.location.bucket}/{key}", client.download_file,
                       self.location.bucket, key, str(target))
        final = dest_root / name
        remove_step_folder(final)
        tmp.rename(final)
        return final

    def is_model_only(self, step: int) -> bool:
        """Whether remote step `step` is a model-only export (reads its marker object)."""
        client = self._client()
        key = self.location.key(step_folder_name(step), MARKER_NAME)
        body = self._call(f"reading s3://{self.location.bucket}/{key}", client.get_object, Bucket=self.location.bucket, Key=key)["Body"].read()
        try:
            return bool(json.loads(body).get("model_only"))
        except (ValueError, AttributeError):
            return False

    def set_aside(self, steps: list[int], folder_name: str) -> None:
        """Move remote steps under `<prefix>/<folder_name>/` (server-side copies, then deletes,
        marker first), where resuming never looks."""
        client = self._client()
        bucket = self.location.bucket
        for step in steps:
            name = step_folder_name(step)
            folder_key = self.location.key(name) + "/"
            listing = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder_key)
            keys = [obj["Key"] for page in self._call(f"listing {self.location}/{name}", list, listing)
                    for obj in page.get("Contents", [])]
            for key in keys:
                new_key = self.location.key(folder_name, name, key[len(folder_key):])
                self._call(f"copying s3://{bucket}/{key}", client.copy, {"Bucket": bucket, "Key": key}, bucket, new_key)
            keys.sort(key=lambda k: not k.endswith("/" + MARKER_NAME))  # the marker first
            for key in keys:
                self._call(f"deleting s3://{bucket}/{key}", client.delete_object, Bucket=bucket, Key=key)

    def _exists(self, client: Any, key: str) -> bool:
        try:
            client.head_object(Bucket=self.location.bucket, Key=key)
            return True
        except Exception as exc:  # botocore's ClientError 404; anything else is a real failure
            if "404" in str(exc) or "Not Found" in str(exc):
                return False
            raise RemoteStorageError(explain_s3_error(exc, f"checking {key}", self.location)) from exc

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RemoteStorageError:
            raise
        except Exception as exc:
            raise RemoteStorageError(explain_s3_error(exc, what, self.location)) from exc


def safe_target(root: Path, relative: str, source: str) -> Path:
    """`root / relative`, refusing a name that would land outside `root` (`../`, absolute)."""
    parts = relative.replace("\\", "/").split("/")
    if not relative or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise RemoteStorageError(
            f"refusing to download {source}: its name {relative!r} would be written outside the download folder "
            f"{root} (an object key with '..', '.', '//' or a leading '/'); the bucket holds objects that kenotron did "
            f"not upload, check who can write to it"
        )
    target = (root / Path(*parts)).resolve()
    if not target.is_relative_to(root.resolve()):
        raise RemoteStorageError(f"refusing to download {source}: it would be written outside {root}")
    return target


def explain_s3_error(exc: BaseException, what: str, location: S3Location) -> str:
    """A message with the cause in plain words and the fix, for the usual boto3 failures."""
    text = redact_url(str(exc))
    name = type(exc).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        why = ("no AWS credentials were found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
               "~/.aws/credentials)")
    elif "NoSuchBucket" in text:
        why = f"the bucket {location.bucket!r} does not exist; create it or fix checkpoint.remote_folder"
    elif any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403")):
        why = f"the credentials are refused for bucket {location.bucket!r} ({_first_line(text)}); check them"
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
        why = f"the endpoint cannot be reached ({_first_line(text)}); check checkpoint.remote_endpoint_url"
    else:
        why = f"{name}: {_first_line(text)}"
    return redact_url(f"{what} failed: {why}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no details"


class BackgroundUploader:
    """Uploads complete step folders one after another in a background thread."""

    def __init__(self, store: S3Store, delete_local: bool) -> None:
        self.store = store
        self.delete_local = delete_local
        self.failures: list[str] = []
        """One message per failed upload (also logged)."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kenotron-upload")
        self._pending: dict[int, Future] = {}

    def submit(self, step: int, path: Path) -> None:
        self._pending = {s: f for s, f in self._pending.items() if not f.done()}
        self._pending[step] = self._executor.submit(self._upload, path)

    def uploading(self) -> set[int]:
        """Steps whose upload has not finished (their local folders must not be deleted yet)."""
        return {s for s, f in self._pending.items() if not f.done()}

    def _upload(self, path: Path) -> None:
        try:
            self.store.upload_step(path)
        # A failed upload must never stop training (the local copy is kept); boto3 client
        # creation and local file listing raise more than RemoteStorageError.
        except Exception as exc:  # noqa: BLE001
            message = (f"checkpoint upload of {path.name} to {self.store.location} failed, training goes on and "
                       f"the local copy {path} is kept: {exc}")
            logger.error(message)
            self.failures.append(message)
            return
        logger.info("uploaded %s to %s", path.name, self.store.location)
        if self.delete_local:
            remove_step_folder(path)

    def wait(self) -> None:
        for future in list(self._pending.values()):
            future.result()

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)
