"""The queued-job cap's counter rows (owner_counters): concurrent submissions never pass the cap, every status
change keeps the counter equal to the owner's queued jobs, and the migration counts the jobs already there."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import httpx
import sqlalchemy as sa
from fastapi.testclient import TestClient
from redis import Redis
from sqlmodel import Session

from api.app import create_app
from jobs.lifecycle.reconciler import reconcile
from jobs.settings import Settings
from jobs.store import limits
from jobs.store.db import get_engine, migrate
from jobs.store.models import Job, Status
from tests.api.conftest import ADMIN, finish_job, key_headers, mlp_spec, session_of, start_job
from tests.conftest import make_settings
from tests.helpers import LOCAL_TLS, Services


def _counted(settings: Settings, owner: str) -> tuple[int, int]:
    """(the owner's counter, the owner's jobs in ``queued`` counted in the jobs table)."""
    with session_of(settings) as s:
        return limits.queued_jobs(s, owner), limits.count(s, owner, (Status.QUEUED.value,))


def _assert_counted(settings: Settings, *owners: str) -> None:
    for owner in owners:
        counter, real = _counted(settings, owner)
        assert counter == real, f"{owner}: counter {counter}, queued jobs {real}"


def test_concurrent_submissions_of_one_owner_never_pass_the_cap(tmp_path: Path, settings: Settings) -> None:
    """50 clients of one owner at once, spread over two API processes sharing the database, against a cap of 7."""
    cap = 7
    first, second = Services(settings, tmp_path / "logs-a"), Services(settings, tmp_path / "logs-b")
    try:
        first.start_api(TORCHYARD_MAX_QUEUED_PER_OWNER=str(cap))
        second.start_api(TORCHYARD_MAX_QUEUED_PER_OWNER=str(cap))
        with first.client() as admin:
            key = admin.post("/v1/keys", json={"owner": "alice", "name": "load"}).json()["key"]
            admin.post("/v1/jobs", json=mlp_spec()).raise_for_status()  # another owner's job takes no slot of alice's
        responses: list[httpx.Response] = []
        barrier = threading.Barrier(50)

        def post(url: str) -> None:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120, verify=LOCAL_TLS) as c:
                barrier.wait()
                responses.append(c.post("/v1/jobs", json=mlp_spec()))

        threads = [threading.Thread(target=post, args=((first if i % 2 else second).url,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert len(responses) == 50
        codes = Counter(r.status_code for r in responses)
        assert codes == {201: cap, 429: 50 - cap}, codes
        for refused in (r for r in responses if r.status_code == 429):
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert int(refused.headers["Retry-After"]) > 0
            assert f"the cap is {cap}" in refused.json()["detail"]
        with first.client() as admin:
            listed = admin.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}, params={"limit": 100}).json()["items"]
        assert sorted(j["id"] for j in listed) == sorted(r.json()["id"] for r in responses if r.status_code == 201)
        assert _counted(settings, "alice") == (cap, cap)
    finally:
        second.stop()
        first.stop()


def test_the_counter_follows_every_change_of_status(settings: Settings) -> None:
    # A lease of an hour: the app's own reconciler (a pass every half lease) runs no pass while the test runs, so the
    # requeue below is the test's own call, not a race with the app's (it won one at load 10).
    capped = settings.model_copy(update={"max_queued_per_owner": 4, "lease_ttl_s": 3600})
    redis = Redis.from_url(settings.redis_url)
    with TestClient(create_app(capped), headers=ADMIN) as client:
        alice, bob = key_headers(client, "alice"), key_headers(client, "bob")

        def submit(headers: dict[str, str], **extra: str) -> httpx.Response:
            return client.post("/v1/jobs", json=mlp_spec(), headers={**headers, **extra})

        ids = [submit(alice).json()["id"] for _ in range(3)]
        assert submit(bob).status_code == 201
        again = submit(alice, **{"Idempotency-Key": "once"})
        assert again.status_code == 201 and submit(alice, **{"Idempotency-Key": "once"}).json()["id"] == again.json()["id"]
        ids.append(again.json()["id"])
        assert submit(alice).status_code == 429  # refused: takes no slot
        _assert_counted(capped, "alice", "bob")
        assert _counted(capped, "alice") == (4, 4)

        # queued -> cancelled
        assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice).json()["status"] == "cancelled"
        _assert_counted(capped, "alice")
        # queued -> running, twice (a worker's claim)
        start_job(capped, ids[1])
        start_job(capped, ids[2])
        _assert_counted(capped, "alice")
        assert _counted(capped, "alice") == (1, 1)
        # running -> queued: the reconciler requeues a job whose worker stopped heart-beating
        with session_of(capped) as s:
            s.exec(sa.update(Job).where(Job.id == ids[1]).values(lease_expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc)))  # type: ignore[call-overload]
            s.commit()
            assert reconcile(s, redis).requeued == [ids[1]]
        _assert_counted(capped, "alice")
        assert _counted(capped, "alice") == (2, 2)
        # running -> cancelling -> cancelled; running -> succeeded
        assert client.post(f"/v1/jobs/{ids[2]}/cancel", headers=alice).json()["status"] == "cancelling"
        finish_job(capped, ids[2], Status.CANCELLED, reason="stopped")
        _assert_counted(capped, "alice")
        start_job(capped, ids[1])
        finish_job(capped, ids[1])
        _assert_counted(capped, "alice")
        # A retry is a new queued job; a delete removes a finished one (never a queued one)
        retried = client.post(f"/v1/jobs/{ids[1]}/retry", headers=alice)
        assert retried.status_code == 201 and retried.json()["status"] == "queued"
        assert client.delete(f"/v1/jobs/{ids[0]}", headers=alice).status_code == 204
        assert client.delete(f"/v1/jobs/{ids[3]}", headers=alice).status_code == 409
        _assert_counted(capped, "alice", "bob")
        assert _counted(capped, "alice") == (2, 2)
        # Room for exactly two more
        assert [submit(alice).status_code for _ in range(3)] == [201, 201, 429]
        _assert_counted(capped, "alice", "bob")
        # At the cap a retry is refused like a submission, in the same statement, and takes no slot
        refused = client.post(f"/v1/jobs/{ids[1]}/retry", headers=alice)
        assert refused.status_code == 429 and "the cap is 4" in refused.json()["detail"]
        assert _counted(capped, "alice") == (4, 4)


_INSERT = ("INSERT INTO jobs (id, owner, name, kind, status, queue, spec, labels, attempt, max_attempts, created_at, updated_at, "
           "last_seq, latest_metrics) VALUES (:id, :owner, 'old', 'catalog', :status, 'default', '{}', '{}', 1, 1, "
           "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 0, '{}')")


def test_the_migration_counts_the_queued_jobs_already_there(tmp_path: Path, database_url: str, redis_url: str) -> None:
    settings = make_settings(tmp_path, database_url, redis_url, max_queued_per_owner=4)
    engine = get_engine(settings.database_url)
    migrate(engine, "0005_read_indexes")
    held = {"alice": ["queued"] * 3 + ["running", "succeeded", "cancelled"], "bob": ["failed", "running"], "carol": ["queued"]}
    with engine.begin() as conn:
        for owner, statuses in held.items():
            for i, status in enumerate(statuses):
                conn.execute(sa.text(_INSERT), {"id": f"{owner}-{i}", "owner": owner, "status": status})
    migrate(engine)
    with Session(engine) as s:
        assert {o: limits.queued_jobs(s, o) for o in held} == {"alice": 3, "bob": 0, "carol": 1}
    # The cap reads what the migration counted: alice has room for one more.
    with TestClient(create_app(settings), headers=ADMIN) as client:
        alice = key_headers(client, "alice")
        assert [client.post("/v1/jobs", json=mlp_spec(), headers=alice).status_code for _ in range(2)] == [201, 429]
    _assert_counted(settings, "alice", "bob", "carol")
