"""A run directory mirrored to a real S3 server by the worker's background uploads: the store down for a while loses
nothing, and a host without the run directory gets back what a resume needs."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from jobs.settings import Settings
from jobs.storage import checkpoints as stored
from jobs.storage import found_checkpoints
from jobs.storage.store import ObjectStore
from tests.helpers import wait_until
from tests.object_store import SeaweedS3
from worker.uploads import Uploads, restore, restore_found

pytestmark = pytest.mark.slow


def _commit(run_dir: Path, step: int, data: bytes) -> None:
    """A checkpoint as the trainer commits it: written aside, renamed into place."""
    tmp = run_dir / "checkpoints" / f".tmp-step_{step:08d}"
    tmp.mkdir(parents=True)
    (tmp / "__0_0.distcp").write_bytes(data)
    (tmp / "meta.json").write_text(f'{{"step": {step}}}')
    tmp.rename(run_dir / "checkpoints" / f"step_{step:08d}")
    (run_dir / "checkpoints" / "latest").write_text(f"step_{step:08d}")


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text)


def _in_store(store: ObjectStore, job_id: str, run_dir: Path, relative: str) -> bool:
    return store.size(stored.job_key(job_id, relative)) == (run_dir / relative).stat().st_size


def test_the_store_down_for_a_while_loses_nothing(s3: SeaweedS3, store: ObjectStore, tmp_path: Path) -> None:
    run_dir, job = tmp_path / "run", "job-down"
    _commit(run_dir, 4, b"a" * 1000)
    _append(run_dir / "events.jsonl", '{"seq": 1}\n')
    _append(run_dir / "logs" / "attempt-1" / "launcher.log", "started\n")
    uploads = Uploads(store, job, run_dir, interval_s=0.2)
    uploads.start()
    try:
        wait_until(lambda: _in_store(store, job, run_dir, "events.jsonl"), 60, what="the first upload")
        s3.stop()
        # The job goes on while the store is away: a checkpoint, events, log lines.
        _commit(run_dir, 8, b"b" * 2000)
        _append(run_dir / "events.jsonl", '{"seq": 2}\n')
        _append(run_dir / "logs" / "attempt-1" / "launcher.log", "step 8\n")
        wait_until(lambda: uploads.failing, 60, what="the uploads to notice the store is away")
        s3.start()
        wait_until(lambda: stored.newest_stored(store, job) is not None and stored.newest_stored(store, job).step == 8, 120,
                   interval_s=0.5, what="the checkpoint committed while the store was away")
        wait_until(lambda: _in_store(store, job, run_dir, "events.jsonl"), 60, what="the events written meanwhile")
        _append(run_dir / "artifacts" / "report.txt", "done\n")
        assert uploads.finish(succeeded=True, wait_s=60)
    finally:
        uploads.stop()
    listing = store.list(stored.job_key(job))
    assert listing["logs/attempt-1/launcher.log"] == len("started\nstep 8\n")
    assert listing["artifacts/report.txt"] == 5
    assert listing["checkpoints/step_00000004/__0_0.distcp"] == 1000
    assert store.get_bytes(stored.job_key(job, "events.jsonl")) == b'{"seq": 1}\n{"seq": 2}\n'


def test_a_host_without_the_run_directory_gets_the_newest_complete_checkpoint(s3: SeaweedS3, store: ObjectStore,
                                                                              tmp_path: Path) -> None:
    host_a, job = tmp_path / "a" / "run", "job-moves"
    _commit(host_a, 10, b"ten")
    _commit(host_a, 20, b"twenty")
    _append(host_a / "events.jsonl", '{"seq": 1}\n{"seq": 2}\n')
    assert Uploads(store, job, host_a).finish(succeeded=False, wait_s=60)
    # A newer checkpoint whose upload stopped before its manifest: never resumed from.
    store.put_bytes(stored.job_key(job, "checkpoints/step_00000030/__0_0.distcp"), b"thirty")

    settings = Settings(storage_url=f"s3://{store.url.bucket}/{store.url.prefix}", s3_endpoint_url=s3.endpoint)
    host_b = tmp_path / "b" / "run"
    host_b.mkdir(parents=True)
    assert restore(settings, job, host_b, keep_going=lambda: True) is None
    assert (host_b / "checkpoints" / "latest").read_text() == "step_00000020"
    assert (host_b / "checkpoints" / "step_00000020" / "__0_0.distcp").read_bytes() == b"twenty"
    assert not (host_b / "checkpoints" / "step_00000030").exists()
    assert (host_b / "events.jsonl").read_bytes() == (host_a / "events.jsonl").read_bytes()  # the trainer's seq goes on


def test_a_start_waits_for_the_store_then_goes_on_with_what_it_has(s3: SeaweedS3, tmp_path: Path) -> None:
    settings = Settings(storage_url=f"s3://{s3.bucket}/t/waits", s3_endpoint_url=s3.endpoint)
    s3.stop()
    try:
        note = restore(settings, "job-away", tmp_path, keep_going=lambda: True, wait_s=1)
    finally:
        s3.start()
    assert note is not None and "could not be read" in note and "secret" not in note.lower()


def _save(path: Path, data: bytes, mtime: float) -> None:
    """A file a script saves in place, as nanoGPT's torch.save(..., "out/ckpt.pt") does, at a given time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def test_a_scripts_own_checkpoint_moves_hosts_whole_and_once(s3: SeaweedS3, store: ObjectStore, tmp_path: Path) -> None:
    host_a, job, now = tmp_path / "a" / "run", "job-script", time.time()
    ckpt = host_a / "workdir" / "out" / "ckpt.pt"
    recorded: list[tuple[str, float, int | None]] = []
    uploads = Uploads(store, job, host_a, found=lambda: list(recorded))
    _save(ckpt, b"iter 10", now - 20)
    recorded[:] = [("workdir/out/ckpt.pt", now - 20, 10)]
    assert uploads.sync()
    _save(ckpt, b"iter 20!", now - 10)  # saved again in place: a newer version of the same path
    recorded[:] = [("workdir/out/ckpt.pt", now - 10, 20)]
    assert uploads.sync()
    # The next save went up but its manifest never did (the host died between the two): not resumed from.
    store.put_bytes(stored.job_key(job, "workdir/out/other.pt"), b"cut")
    assert len(store.list(stored.job_key(job, found_checkpoints.FOUND))) == 1  # the older save's manifest is gone

    settings = Settings(storage_url=f"s3://{store.url.bucket}/{store.url.prefix}", s3_endpoint_url=s3.endpoint)
    host_b = tmp_path / "b" / "run"
    (host_b / "workdir").mkdir(parents=True)
    assert restore_found(settings, job, host_b, keep_going=lambda: True) is None
    restored = host_b / "workdir" / "out" / "ckpt.pt"
    assert restored.read_bytes() == b"iter 20!"
    assert abs(restored.stat().st_mtime - (now - 10)) < 1e-3  # as written: found on host B as the script's own save
    assert not (host_b / "workdir" / "out" / "other.pt").exists()
    # Host B's uploads find it already in the store: nothing is sent again.
    assert found_checkpoints.upload_found(store, job, host_b, "workdir/out/ckpt.pt", restored.stat().st_mtime, 20) is None


def test_a_link_the_job_planted_never_takes_a_restore_outside_its_run(s3: SeaweedS3, store: ObjectStore,
                                                                     tmp_path: Path) -> None:
    host_a, job = tmp_path / "a" / "run", "job-planted"
    _save(host_a / "workdir" / "out" / "ckpt.pt", b"weights", time.time() - 5)
    Uploads(store, job, host_a, found=lambda: [("workdir/out/ckpt.pt", time.time() - 5, 3)]).sync()
    assert found_checkpoints.newest_found(store, job) is not None
    settings = Settings(storage_url=f"s3://{store.url.bucket}/{store.url.prefix}", s3_endpoint_url=s3.endpoint)
    host_b, elsewhere = tmp_path / "b" / "run", tmp_path / "elsewhere"
    (host_b / "workdir").mkdir(parents=True)
    elsewhere.mkdir()
    (host_b / "workdir" / "out").symlink_to(elsewhere)  # left by an earlier attempt of the job on this host
    note = restore_found(settings, job, host_b, keep_going=lambda: True)
    assert note is not None and "not restored" in note
    assert list(elsewhere.iterdir()) == []


def test_checkpoints_pruned_on_the_host_go_from_the_store_once_a_newer_one_is_in(s3: SeaweedS3, store: ObjectStore,
                                                                                 tmp_path: Path) -> None:
    run_dir, job, now = tmp_path / "run", "job-prunes", time.time()
    trainer = run_dir / "workdir" / "checkpoint-10"  # a Trainer's, with save_total_limit=1
    _save(trainer / "model.safetensors", b"ten", now - 20)
    recorded = [("workdir/checkpoint-10", now - 20, 10)]
    uploads = Uploads(store, job, run_dir, found=lambda: list(recorded))
    _commit(run_dir, 4, b"four")
    assert uploads.sync()
    assert set(store.list(stored.job_key(job))) >= {"checkpoints/step_00000004/__0_0.distcp",
                                                    "workdir/checkpoint-10/model.safetensors"}
    # The trainer's keep_last and the Trainer's save_total_limit: a newer one saved, the older one removed here.
    _commit(run_dir, 8, b"eight")
    shutil.rmtree(run_dir / "checkpoints" / "step_00000004")
    _save(run_dir / "workdir" / "checkpoint-20" / "model.safetensors", b"twenty", now - 10)
    recorded.append(("workdir/checkpoint-20", now - 10, 20))
    shutil.rmtree(trainer)
    assert uploads.sync()
    left = store.list(stored.job_key(job))
    assert "checkpoints/step_00000008/__0_0.distcp" in left and "workdir/checkpoint-20/model.safetensors" in left
    assert not [k for k in left if "step_00000004" in k or "checkpoint-10" in k], left
    assert stored.newest_stored(store, job).name == "step_00000008"  # type: ignore[union-attr]
    assert found_checkpoints.newest_found(store, job).step == 20  # type: ignore[union-attr]
    assert uploads.sync() and store.list(stored.job_key(job)) == left  # nothing more removed on the next pass


def test_a_retried_job_on_another_host_starts_from_the_retried_jobs_checkpoint_in_the_store(
        s3: SeaweedS3, store: ObjectStore, tmp_path: Path) -> None:
    old = tmp_path / "a" / "runs" / "job-old"
    _commit(old, 12, b"twelve")
    assert Uploads(store, "job-old", old).finish(succeeded=False, wait_s=60)
    settings = Settings(storage_url=f"s3://{store.url.bucket}/{store.url.prefix}", s3_endpoint_url=s3.endpoint)
    retry = tmp_path / "b" / "runs" / "job-retry"  # on a host without job-old's run directory
    retry.mkdir(parents=True)
    assert restore(settings, "job-retry", retry, keep_going=lambda: True,
                   resume_from=str(old / "checkpoints" / "step_00000012")) is None
    assert (retry / "checkpoints" / "latest").read_text() == "step_00000012"
    assert (retry / "checkpoints" / "step_00000012" / "__0_0.distcp").read_bytes() == b"twelve"
