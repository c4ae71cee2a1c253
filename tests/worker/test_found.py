"""TensorBoard event files a job writes anywhere in its directory become metric rows, without the SDK."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from torch.utils.tensorboard import SummaryWriter

from jobs.reads import feed
from jobs.settings import Settings
from jobs.store.ingest import ingest_events
from jobs.store.ingest_found import FOUND_BASE, FoundPoint, ingest_found
from jobs.store.models import Job, MetricPoint
from tests.helpers import plain_db, session_with_job
from worker.found import Found
from worker.run_files import Listing, find_files
from worker.tb_tail import TensorBoardTail


def _write(logdir: Path, tag: str, steps: range, scale: float = 1.0) -> None:
    writer = SummaryWriter(str(logdir))
    for step in steps:
        writer.add_scalar(tag, scale * step, step)
    writer.close()


def test_event_files_anywhere_are_read_incrementally_and_the_sdk_mirror_is_skipped(tmp_path: Path) -> None:
    _write(tmp_path / "lightning_logs" / "version_0", "train_loss", range(3))
    _write(tmp_path / "artifacts" / "tensorboard", "mirrored", range(3))  # the SDK's own copy of its metrics
    tail = TensorBoardTail(tmp_path, rescan_s=0)
    points = tail.read()
    assert sorted((p.name, p.step, p.value) for p in points) == [("train_loss", i, float(i)) for i in range(3)]
    # Not acknowledged (the database blipped): offered again, and nothing is lost.
    assert len(tail.read()) == 3
    tail.ack(3)
    assert tail.read() == []
    # A file that appears later in another directory (an HF Trainer's runs/<date>/) is found on the next scan.
    _write(tmp_path / "out" / "runs" / "Nov25", "train/loss", range(10, 12), scale=0.5)
    assert sorted((p.name, p.step, p.value) for p in tail.read()) == [("train/loss", 10, 5.0), ("train/loss", 11, 5.5)]


def test_a_half_written_record_waits_for_the_rest(tmp_path: Path) -> None:
    _write(tmp_path / "src", "loss", range(5))
    whole = next((tmp_path / "src").glob("*tfevents*")).read_bytes()
    growing = tmp_path / "job" / "events.out.tfevents.1.host"
    growing.parent.mkdir()
    growing.write_bytes(whole[: len(whole) - 7])  # the last record torn mid-way
    tail = TensorBoardTail(tmp_path / "job", rescan_s=0)
    first = tail.read()
    tail.ack(len(first))
    assert [p.step for p in first] == [0, 1, 2, 3]
    growing.write_bytes(whole)
    assert [p.step for p in tail.read()] == [4]


def test_found_metrics_are_stored_with_their_own_seqs_and_leave_the_sdk_alone(settings: Settings, tmp_path: Path) -> None:
    with session_with_job(settings, tmp_path) as (session, job):
        found = Found(tmp_path)
        _write(tmp_path / "tb", "acc", range(1, 4), scale=0.25)

        assert found.ingest(session, job.id, [], plain_db, batch=2, final=True) == 3
        # The SDK's own events still count from 1: the found rows never moved its high-water mark.
        sdk = [{"seq": 1, "time": 1.0, "type": "metric", "step": 1, "values": {"loss": 2.0}}]
        assert ingest_events(session, job.id, sdk) == 1
        rows = session.exec(sa.select(MetricPoint).where(MetricPoint.job_id == job.id).order_by(MetricPoint.seq)).scalars().all()
        assert [(r.name, r.step, r.seq) for r in rows] == [
            ("loss", 1, 1), ("acc", 1, FOUND_BASE + 1), ("acc", 2, FOUND_BASE + 2), ("acc", 3, FOUND_BASE + 3)]
        fresh = session.get(Job, job.id, populate_existing=True)
        assert fresh is not None and fresh.last_seq == 1 and fresh.last_step == 3
        assert fresh.latest_metrics == {"acc": 0.75, "loss": 2.0}
        # A later attempt reads the files from their start: what is stored already gets no new seq.
        again = Found(tmp_path)
        assert again.ingest(session, job.id, [], plain_db, batch=500, final=True) == 3
        assert session.exec(sa.select(sa.func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job.id)).scalar_one() == 4
        assert again.seq == FOUND_BASE + 3


def test_the_event_feed_sends_sdk_and_found_rows_and_resumes_from_either(settings: Settings, tmp_path: Path) -> None:
    with session_with_job(settings, tmp_path) as (session, job):
        sdk = [{"seq": s, "time": float(s), "type": "metric", "step": s, "values": {"loss": 1.0 / s}} for s in (1, 2)]
        ingest_events(session, job.id, sdk)
        ingest_found(session, job.id, FOUND_BASE, [FoundPoint("acc", 7, 0.5, 3.0)])
        batch = feed.poll(session, job.id, feed.Cursor())
        metrics = [(m.data["step"], m.id) for m in batch.messages if m.event == "metric"]
        assert [step for step, _ in metrics] == [1, 2, 7]
        resumed = feed.Cursor.parse(metrics[-1][1])
        assert (resumed.seq, resumed.found) == (2, FOUND_BASE + 1)
        # The SDK goes on counting from 3, below the found seqs: a client at that cursor still gets it.
        ingest_events(session, job.id, [{"seq": 3, "time": 4.0, "type": "metric", "step": 3, "values": {"loss": 0.3}}])
        later = feed.poll(session, job.id, resumed)
        assert [m.data["step"] for m in later.messages if m.event == "metric"] == [3]
        assert feed.Cursor.parse("5-9") == feed.Cursor(5, 9, 0)  # ids sent before found rows existed still parse


def test_the_unpacked_upload_is_not_the_jobs_output(tmp_path: Path) -> None:
    _write(tmp_path / "code" / "runs", "shipped", range(2))  # event files that came with the bundle
    _write(tmp_path / "runs", "loss", range(2))
    assert {p.name for p in TensorBoardTail(tmp_path, rescan_s=0).read()} == {"loss"}


def test_a_follower_sees_the_resume_after_a_requeue_not_the_history_again(settings: Settings, tmp_path: Path) -> None:
    """What ``torchyard submit/watch --follow`` is sent across a requeue of a script whose metrics are read from its
    TensorBoard files: the new attempt reads every file from its start, and only the resumed steps reach the feed."""
    with session_with_job(settings, tmp_path) as (session, job):

        _write(tmp_path / "lightning_logs" / "version_1", "train_loss", range(10, 60, 10))  # attempt 1: steps 10..50
        Found(tmp_path).ingest(session, job.id, [], plain_db, batch=500, final=True)
        seen = feed.poll(session, job.id, feed.Cursor())
        assert [m.data["step"] for m in seen.messages if m.event == "metric"] == [10, 20, 30, 40, 50]
        # Requeued; attempt 2 resumes from its checkpoint at step 30 and logs 40, 50, 60 into a new file.
        _write(tmp_path / "lightning_logs" / "version_2", "train_loss", range(40, 70, 10), scale=0.5)
        Found(tmp_path).ingest(session, job.id, [], plain_db, batch=500, final=True)
        resumed = feed.poll(session, job.id, seen.cursor)
        assert [(m.data["step"], m.data["values"]["train_loss"]) for m in resumed.messages if m.event == "metric"] == [
            (40, 20.0), (50, 25.0), (60, 30.0)]


def test_one_shared_walk_finds_what_each_tails_own_walk_finds(tmp_path: Path) -> None:
    for relative in ["a/run-1.wandb", "a/b/events.out.tfevents.1", "mlflow.db", "logs/skipped.db", "code/up.db",
                     "mlruns/0/r/meta.yaml", "mlruns/0/r/metrics/loss", *[f"data/f{i:03d}.db" for i in range(300)]]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"")
    (tmp_path / "linked.db").symlink_to(tmp_path / "mlflow.db")
    (tmp_path / "linked_dir").symlink_to(tmp_path / "a")
    listing = Listing(tmp_path)
    for match in (lambda n: n.endswith(".db"), lambda n: "tfevents" in n, lambda n: n == "meta.yaml", lambda n: True):
        for limit in (1, 10, 256):
            assert listing.matching(match, limit) == find_files(tmp_path, match, limit)
    assert Path(tmp_path / "linked.db") not in listing.matching(lambda n: True, 1000)
