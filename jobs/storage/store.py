"""The object store: a bucket and prefix of an S3-compatible server, through boto3.

boto3 reads the region and credentials where it always does (AWS_* variables, ~/.aws, an instance role); the
endpoint of a server other than AWS is TORCHYARD_S3_ENDPOINT_URL. Calls are retried by botocore's standard retry
mode (throttling, 5xx, connection errors, with backoff); what still fails raises StoreError, whose message names
the operation, the key and the server's error code, never a credential nor the server's own words (some servers
echo the signed request).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from jobs.storage.url import StorageUrl, parse

if TYPE_CHECKING:
    from jobs.settings import Settings

log = logging.getLogger(__name__)

_CODE = re.compile(r"[^A-Za-z0-9.]")
_DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys


class StoreError(Exception):
    """A call to the object store failed after botocore's retries; the message is safe to log and show."""


class NotInStore(StoreError):
    """The object asked for is not in the store."""


def _boto_errors() -> tuple[type[BaseException], ...]:
    """What a boto3 call raises when the store fails (boto3 is imported by the first store made, not by every process
    that imports this module: the API, a worker and the CLI without a store never pay its second of import)."""
    import botocore.exceptions
    from boto3.exceptions import Boto3Error

    return botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, Boto3Error


def preload() -> None:
    """Import boto3 now, in a worker about to fork tasks that each use the store: they inherit it."""
    import boto3.s3.transfer  # noqa: F401

    _boto_errors()


def _code(exc: BaseException) -> str:
    """What went wrong, in a word the server or botocore chose: an error code or an exception's class name."""
    import botocore.exceptions
    from boto3.exceptions import Boto3Error

    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "error")
        return _CODE.sub("", code)[:64] or "error"
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or another source boto3 reads)"
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, Boto3Error) and cause is not None:  # S3UploadFailedError wraps the ClientError
        return _code(cause)
    return type(exc).__name__


def _missing(exc: BaseException) -> bool:
    return _code(exc) in ("404", "NoSuchKey", "NotFound")


class ObjectStore:
    """One bucket and prefix; keys given to the methods are relative to the prefix."""

    def __init__(self, url: StorageUrl, endpoint_url: str | None = None, *, max_attempts: int = 5,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.url = url
        config = Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=connect_timeout_s,
                        read_timeout=read_timeout_s, signature_version="s3v4",
                        # Path-style: S3-compatible servers rarely resolve bucket.host names.
                        s3={"addressing_style": "path" if endpoint_url else "auto"})
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)
        self.transfer = TransferConfig(multipart_threshold=64 * 1024 * 1024, multipart_chunksize=64 * 1024 * 1024,
                                       max_concurrency=8, use_threads=True)

    def _key(self, key: str) -> str:
        return self.url.key(key)

    @contextlib.contextmanager
    def _call(self, what: str, key: str) -> Iterator[None]:
        try:
            yield
        except _boto_errors() as exc:
            where = f"s3://{self.url.bucket}/{self._key(key)}"
            kind = NotInStore if _missing(exc) else StoreError
            raise kind(f"object store: {what} {where} failed: {_code(exc)}") from None

    def put_file(self, key: str, path: Path) -> int:
        """Upload the file at ``path``; its size. OSError where the file cannot be read."""
        size = path.stat().st_size
        with self._call("upload to", key):
            self.client.upload_file(str(path), self.url.bucket, self._key(key), Config=self.transfer)
        return size

    def put_open(self, key: str, f: BinaryIO) -> int:
        """Upload the open file ``f`` from its start (a file opened without following links: what is sent is what was
        opened); its size as it was opened."""
        size = os.fstat(f.fileno()).st_size
        with self._call("upload to", key):
            self.client.upload_fileobj(f, self.url.bucket, self._key(key), Config=self.transfer)
        return size

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._call("upload to", key):
            self.client.put_object(Bucket=self.url.bucket, Key=self._key(key), Body=data)

    def get_file(self, key: str, dest: Path) -> int:
        """Download to ``dest`` (through a temporary name beside it, so ``dest`` is whole or absent); its size."""
        tmp = dest.with_name(f".{dest.name}.part")
        try:
            with self._call("download of", key):
                self.client.download_file(self.url.bucket, self._key(key), str(tmp), Config=self.transfer)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest.stat().st_size

    def get_bytes(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes, or those from ``start`` to ``end`` inclusive (an HTTP Range)."""
        extra = {}
        if start is not None:
            extra["Range"] = f"bytes={start}-{'' if end is None else end}"
        with self._call("download of", key):
            body = self.client.get_object(Bucket=self.url.bucket, Key=self._key(key), **extra)["Body"]
            try:
                return body.read()
            finally:
                body.close()

    def size(self, key: str) -> int | None:
        """The object's size; None when it is not there."""
        try:
            with self._call("size of", key):
                return int(self.client.head_object(Bucket=self.url.bucket, Key=self._key(key))["ContentLength"])
        except NotInStore:
            return None

    def list(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` (a folder: '/' is added), key relative to it -> size."""
        return {key: size for key, (size, _modified) in self.entries(prefix).items()}

    def entries(self, prefix: str, limit: int | None = None) -> dict[str, tuple[int, float]]:
        """The objects under ``prefix`` in key order, at most ``limit``: key relative to it -> (size, modified as a
        POSIX time)."""
        base = self._key(prefix).rstrip("/") + "/"
        found: dict[str, tuple[int, float]] = {}
        with self._call("listing of", prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=base):
                for item in page.get("Contents", []):
                    found[item["Key"][len(base):]] = (int(item["Size"]), item["LastModified"].timestamp())
                    if limit is not None and len(found) >= limit:
                        return found
        return found

    def delete(self, key: str) -> None:
        """Delete one object (nothing happens where there is none)."""
        with self._call("deletion of", key):
            self.client.delete_object(Bucket=self.url.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str, keep: Collection[str] = ()) -> int:
        """Delete every object under ``prefix`` (a folder) but those ``keep`` names (relative to it); how many were deleted."""
        keys = [f"{prefix.rstrip('/')}/{rel}" for rel in self.list(prefix) if rel not in keep]
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": self._key(k)} for k in keys[i:i + _DELETE_BATCH]]
            with self._call("deletion under", prefix):
                answer = self.client.delete_objects(Bucket=self.url.bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                codes = sorted({_CODE.sub("", str(e.get("Code", "error"))) for e in answer["Errors"]})
                raise StoreError(f"object store: deleting {len(answer['Errors'])} objects under "
                                 f"s3://{self.url.bucket}/{self._key(prefix)} failed: {', '.join(codes)}")
        return len(keys)


def until_answered(what: Callable[[], object], keep_going: Callable[[], object], wait_s: float, retry_s: float = 1.0) -> None:
    """Call ``what`` again while the store does not answer (StoreError), every ``retry_s``, for up to ``wait_s``;
    ``keep_going`` is called between tries and a false answer stops the wait. Raises the last StoreError once the wait
    is over, whichever ended it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            what()
            return
        except StoreError:
            if time.monotonic() > deadline or not keep_going():
                raise
            time.sleep(retry_s)


def store_for(settings: Settings) -> ObjectStore | None:
    """The store TORCHYARD_STORAGE_URL names, one per process (a forked child makes its own: a client's connections
    are never shared across a fork); None without the setting."""
    if settings.storage_url is None:
        return None
    return _store(settings.storage_url, settings.s3_endpoint_url, os.getpid())


@lru_cache(maxsize=4)
def _store(url: str, endpoint_url: str | None, _pid: int) -> ObjectStore:
    return ObjectStore(parse(url), endpoint_url)
