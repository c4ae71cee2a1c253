"""The object store against a real S3 server (SeaweedFS): files in and out whole and by range, checkpoints that count
only once complete, and errors that never carry a credential."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from jobs.storage import checkpoints as stored
from jobs.storage.manifest import Manifest
from jobs.storage.store import NotInStore, ObjectStore, StoreError
from jobs.storage.url import StorageUrl
from tests.object_store import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slow


def _checkpoint(root: Path, name: str, files: dict[str, bytes]) -> Path:
    ckpt = root / "checkpoints" / name
    for relative, data in files.items():
        (ckpt / relative).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / relative).write_bytes(data)
    return ckpt


def test_round_trips_ranges_listing_and_deletion(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "big.bin").write_bytes(data)
    with (tmp_path / "big.bin").open("rb") as f:
        assert store.put_open("jobs/j1/big.bin", f) == len(data)
    store.put_bytes("jobs/j1/logs/a.log", b"line one\nline two\n")
    store.put_bytes("jobs/j2/other", b"x")

    assert store.get_file("jobs/j1/big.bin", tmp_path / "back.bin") == len(data)
    assert (tmp_path / "back.bin").read_bytes() == data
    assert store.get_bytes("jobs/j1/big.bin", 1000, 1999) == data[1000:2000]
    assert store.get_bytes("jobs/j1/big.bin", len(data) - 5) == data[-5:]
    assert store.get_bytes("jobs/j1/logs/a.log") == b"line one\nline two\n"
    assert store.size("jobs/j1/big.bin") == len(data) and store.size("jobs/j1/nothing") is None
    assert store.list("jobs/j1") == {"big.bin": len(data), "logs/a.log": 18}

    assert store.delete_prefix("jobs/j1") == 2
    assert store.list("jobs/j1") == {} and store.list("jobs/j2") == {"other": 1}
    with pytest.raises(NotInStore):
        store.get_bytes("jobs/j1/big.bin")
    assert not (tmp_path / ".gone.part").exists()


def test_a_checkpoint_goes_up_whole_and_comes_down_verified(store: ObjectStore, tmp_path: Path) -> None:
    files = {".metadata": b"meta", "__0_0.distcp": os.urandom(100_000), "rng/rank_00000.pt": b"rng", "meta.json": b"{}"}
    manifest = stored.upload_checkpoint(store, "job1", _checkpoint(tmp_path / "a", "step_00000010", files))
    assert manifest.files == {k: len(v) for k, v in files.items()} and manifest.step == 10

    newest = stored.newest_stored(store, "job1")
    assert newest == manifest
    target = stored.download_checkpoint(store, "job1", newest, tmp_path / "b" / "checkpoints")
    assert {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()} == files


def test_a_half_uploaded_checkpoint_is_never_chosen(store: ObjectStore, tmp_path: Path) -> None:
    older = stored.upload_checkpoint(store, "job2", _checkpoint(tmp_path, "step_00000010", {"model.distcp": b"old"}))
    # A newer one whose upload stopped before its manifest: its files are there, it does not count.
    store.put_bytes(stored.job_key("job2", "checkpoints/step_00000020/model.distcp"), b"new")
    assert stored.newest_stored(store, "job2") == older
    # Another whose manifest arrived but one of its files did not (deleted behind it): it does not count either.
    newer = stored.upload_checkpoint(store, "job2", _checkpoint(tmp_path, "step_00000030", {"model.distcp": b"n", "meta.json": b"{}"}))
    assert stored.newest_stored(store, "job2") == newer
    store.client.delete_object(Bucket=store.url.bucket, Key=store.url.key(stored.job_key("job2", "checkpoints/step_00000030/model.distcp")))
    assert stored.newest_stored(store, "job2") == older


def test_a_download_that_does_not_match_its_manifest_leaves_nothing(store: ObjectStore, tmp_path: Path) -> None:
    stored.upload_checkpoint(store, "job3", _checkpoint(tmp_path / "a", "step_00000005", {"w": b"12345"}))
    lying = Manifest("step_00000005", {"w": 4}, 5)
    with pytest.raises(StoreError, match="manifest says 4"):
        stored.download_checkpoint(store, "job3", lying, tmp_path / "b")
    assert list((tmp_path / "b").iterdir()) == []
    escaping = Manifest("step_00000005", {"../../outside": 5}, 5)
    with pytest.raises(StoreError, match="outside"):
        stored.download_checkpoint(store, "job3", escaping, tmp_path / "c")
    assert not (tmp_path / "outside").exists()


def test_links_in_a_checkpoint_are_not_followed(store: ObjectStore, tmp_path: Path) -> None:
    secret = tmp_path / "worker-only.txt"
    secret.write_text("not the job's")
    ckpt = _checkpoint(tmp_path / "run", "step_00000001", {"w": b"w"})
    (ckpt / "planted").symlink_to(secret)
    manifest = stored.upload_checkpoint(store, "job4", ckpt)
    assert manifest.files == {"w": 1}
    assert "planted" not in " ".join(store.list(stored.job_key("job4")))


def test_errors_name_the_key_and_code_never_a_credential(s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    wrong_secret = "wrong-secret-f00dbabe-do-not-leak"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    bad = ObjectStore(StorageUrl(s3.bucket, "t/errors"), s3.endpoint, max_attempts=2)
    caplog.set_level(logging.DEBUG, logger="jobs")
    with pytest.raises(StoreError) as caught:
        bad.put_bytes("jobs/x/y", b"data")
    message = str(caught.value)
    assert f"s3://{s3.bucket}/t/errors/jobs/x/y" in message and "upload" in message
    for secret in (wrong_secret, SECRET_KEY, ACCESS_KEY):
        assert secret not in message and secret not in caplog.text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained server answer in a traceback

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    missing = ObjectStore(StorageUrl("no-such-bucket-here", ""), s3.endpoint, max_attempts=1)
    with pytest.raises(StoreError, match="no-such-bucket-here"):
        missing.list("jobs")
