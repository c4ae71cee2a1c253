"""TORCHYARD_STORAGE_URL: an s3:// bucket and prefix, refused with the reason, never echoing a credential."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from jobs.settings import Settings
from jobs.storage.url import StorageUrl, StorageUrlError, parse


@pytest.mark.parametrize(("value", "bucket", "prefix"), [
    ("s3://my-bucket", "my-bucket", ""), ("s3://my-bucket/", "my-bucket", ""),
    ("s3://runs.example/torchyard/prod/", "runs.example", "torchyard/prod"), (" s3://abc//a//b ", "abc", "a/b"),
])
def test_parse(value: str, bucket: str, prefix: str) -> None:
    url = parse(value)
    assert url == StorageUrl(bucket, prefix)
    assert url.key("jobs", "j1/") == "/".join(p for p in (prefix, "jobs", "j1") if p)


@pytest.mark.parametrize(("value", "says"), [
    ("https://s3.amazonaws.com/b", "s3://BUCKET"), ("my-bucket", "s3://BUCKET"), ("s3://", "names no bucket"),
    ("s3://My_Bucket", "not a valid bucket name"), ("s3://10.0.0.1/x", "not a valid bucket name"),
    ("s3://bucket/a/../x", "not allowed"), ("s3://bucket/a?x=1", "no query"),
])
def test_refused_with_the_reason(value: str, says: str) -> None:
    with pytest.raises(StorageUrlError, match=re.escape(says)):
        parse(value)


def test_credentials_in_the_url_are_refused_without_being_repeated() -> None:
    with pytest.raises(StorageUrlError) as caught:
        parse("s3://AKIASECRETKEYID:hunter2secret@bucket/x")
    assert "hunter2secret" not in str(caught.value) and "AKIASECRETKEYID" not in str(caught.value)
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)


def test_settings_validate_the_url_and_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(storage_url="s3://bucket/p/").storage_url == "s3://bucket/p"
    assert Settings(storage_url="  ").storage_url is None
    with pytest.raises(ValidationError, match="s3://BUCKET"):
        Settings(storage_url="gs://bucket")
    with pytest.raises(ValidationError) as caught:
        Settings(s3_endpoint_url="http://key:topsecret@127.0.0.1:8333")
    assert "topsecret" not in str(caught.value)
    with pytest.raises(ValidationError, match="http:// or https://"):
        Settings(s3_endpoint_url="127.0.0.1:8333")
    monkeypatch.setenv("TORCHYARD_STORAGE_URL", "s3://from-env/x")
    assert Settings().storage_url == "s3://from-env/x"
