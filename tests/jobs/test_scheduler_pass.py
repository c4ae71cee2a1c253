"""The scheduler's pass against real SQL and Redis: placements written with the job's move to running, tasks on the
hosts' queues, reasons and positions stored on the waiting jobs, and nothing written without the leader lease."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis
from rq import Queue

from jobs.hosts import registry as hosts
from jobs.scheduling import leader
from jobs.scheduling.scheduler import host_queue, run_pass, task_id
from jobs.settings import Settings
from jobs.store.models import Attempt, Job
from tests.api.conftest import app, client, session_of  # noqa: F401 - fixtures
from tests.conftest import make_settings

LEADER = "worker-a"


def _host(settings: Settings, host_id: str, gpus: int, cpu_slots: int = 4, queues: tuple[str, ...] = ("default",)) -> None:
    with session_of(settings) as s:
        hosts.register(s, hosts.Inventory(id=host_id, gpus=tuple(range(gpus)), cpu_slots=cpu_slots, queues=queues))


def _submit(api: TestClient, nproc: int | str, nnodes: int = 1, device: str = "cuda") -> str:
    spec = {"kind": "script", "name": f"g{nproc}", "entrypoint": "train.py",
            "parallel": {"nproc_per_node": nproc, "nnodes": nnodes, "device": device}}
    resp = api.post("/v1/jobs", json=spec)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def _pass(settings: Settings, holder: str = LEADER):  # type: ignore[no-untyped-def]
    with session_of(settings) as s:
        assert leader.hold(s, leader.SCHEDULER, holder, settings.lease_ttl_s)
        return run_pass(s, Redis.from_url(settings.redis_url), settings, holder)


def _job(settings: Settings, job_id: str) -> Job:
    with session_of(settings) as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def test_a_pass_packs_a_host_and_stores_why_the_rest_wait(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 4)
    three, one, two = _submit(client, 3), _submit(client, 1), _submit(client, 2)
    report = _pass(settings)
    assert report.placed == [three, one] and report.waiting == 1
    placed = {j: _job(settings, j) for j in (three, one)}
    assert {j: job.status for j, job in placed.items()} == {three: "running", one: "running"}
    gpus = [set(job.placement[0]["gpus"]) for job in placed.values()]  # type: ignore[index]
    assert gpus[0].isdisjoint(gpus[1]) and len(gpus[0]) == 3 and len(gpus[1]) == 1
    assert all(job.placement[0]["host"] == "gpu-a" and job.worker_id == "gpu-a" for job in placed.values())  # type: ignore[index]
    with session_of(settings) as s:
        attempt = s.get(Attempt, (three, 1))
        assert attempt is not None and attempt.placement == placed[three].placement and attempt.worker_id is None

    waiting = _job(settings, two)
    assert waiting.status == "queued" and waiting.queue_position == 0
    # It fitted the idle host and the two before it took that: the first blocked job holds the host from when they end.
    assert waiting.waiting_reason.startswith("waiting for 2 GPUs on one host: gpu-a is reserved for it from about ")  # type: ignore[union-attr]
    tasks = Queue(host_queue("gpu-a"), connection=Redis.from_url(settings.redis_url)).job_ids
    assert tasks == [task_id(three, 1, 0), task_id(one, 1, 0)]

    # Another pass changes nothing: the GPUs are held by the running placements.
    assert _pass(settings).placed == []
    # The 3-GPU job ends: the 2-GPU job gets two of the three GPUs it freed.
    with session_of(settings) as s:
        s.exec(sa.update(Job).where(Job.id == three).values(status="succeeded"))
        s.commit()
    assert _pass(settings).placed == [two]
    freed = set(_job(settings, two).placement[0]["gpus"])  # type: ignore[index]
    assert freed <= set(placed[three].placement[0]["gpus"]) and len(freed) == 2  # type: ignore[index]
    assert _job(settings, two).waiting_reason is None


def test_a_changed_priority_moves_a_waiting_job_ahead_and_preempts_for_it(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 2)
    running = _submit(client, 2)
    assert _pass(settings).placed == [running]
    first, second = _submit(client, 2), _submit(client, 2)
    _pass(settings)
    assert (_job(settings, first).queue_position, _job(settings, second).queue_position) == (0, 1)

    changed = client.patch(f"/v1/jobs/{second}", json={"priority": 80})
    assert changed.status_code == 200 and changed.json()["priority"] == 80, changed.text
    assert client.patch(f"/v1/jobs/{running}", json={"priority": 10}).json()["priority"] == 10  # a running job's too
    report = _pass(settings.model_copy(update={"preempt_min_runtime_s": 0}))
    # The raised job goes first in line, and the lowered one, now below it, is asked to make room for it.
    assert (_job(settings, second).queue_position, _job(settings, first).queue_position) == (0, 1)
    assert report.preempted == [running]
    assert f"job {second} (priority 80)" in (_job(settings, running).stop_request or "")
    assert client.get(f"/v1/jobs/{first}").json()["priority"] == 50  # nothing else changed


def test_gangs_get_every_host_at_once_and_queues_are_kept_apart(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "a", 2)
    _host(settings, "b", 2)
    gang = _submit(client, 2, nnodes=2)
    too_big = _submit(client, 2, nnodes=3)
    cpu = _submit(client, 2, device="cpu")
    report = _pass(settings)
    assert report.placed == [gang, cpu]
    nodes = _job(settings, gang).placement
    assert [(n["node_rank"], n["host"], n["gpus"]) for n in nodes] == [(0, "a", [0, 1]), (1, "b", [0, 1])]  # type: ignore[union-attr]
    assert _job(settings, cpu).placement[0]["cpu_slots"] == 2  # type: ignore[index]
    assert _job(settings, too_big).waiting_reason == "needs 3 hosts with 2 GPUs; only 2 have 2"
    redis = Redis.from_url(settings.redis_url)
    assert task_id(gang, 1, 1) in Queue(host_queue("b"), connection=redis).job_ids


def test_no_live_host_for_a_queue_and_the_owners_running_cap(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 8, queues=("other",))
    job = _submit(client, 1)
    _pass(settings)
    assert _job(settings, job).waiting_reason == "no live host serves queue default"
    capped = settings.model_copy(update={"max_running_per_owner": 1})
    never = _submit(client, 1, nnodes=2)  # can never run on one host: it must not use up the owner's allowance
    _host(settings, "gpu-b", 8)
    second = _submit(client, 1)
    assert _pass(capped).placed == [job]
    assert _job(settings, never).waiting_reason == "needs 2 hosts with 1 GPU; only 1 has 1"
    assert _job(settings, second).waiting_reason == "over the owner's running-job cap: 0 running and 1 placed ahead of it, the cap is 1"
    assert _pass(capped).placed == []
    assert _job(settings, second).waiting_reason == "over the owner's running-job cap: 1 running, the cap is 1"


def test_without_the_lease_a_pass_writes_nothing(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 4)
    job = _submit(client, 1)
    with session_of(settings) as s:
        assert leader.hold(s, leader.SCHEDULER, "other", settings.lease_ttl_s)
        assert not leader.hold(s, leader.SCHEDULER, LEADER, settings.lease_ttl_s)
        assert leader.SCHEDULER in leader.held(s)
        report = run_pass(s, Redis.from_url(settings.redis_url), settings, LEADER)
    assert report.lost_lease and report.placed == []
    assert _job(settings, job).status == "queued"
    assert Queue(host_queue("gpu-a"), connection=Redis.from_url(settings.redis_url)).count == 0
    with session_of(settings) as s:
        leader.release(s, leader.SCHEDULER, "other")
        assert leader.SCHEDULER not in leader.held(s)  # what `python -m stack` waits on before its ready block
        assert leader.hold(s, leader.SCHEDULER, LEADER, settings.lease_ttl_s)  # a released lease is taken at once


def test_a_submission_wakes_the_leader_instead_of_waiting_for_its_next_pass(client: TestClient, settings: Settings) -> None:  # noqa: F811
    from jobs.scheduling.scheduler import SchedulerLoop
    from tests.helpers import wait_until

    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 2)
    loop = SchedulerLoop(settings, LEADER, Redis.from_url(settings.redis_url), interval_s=60)  # a pass a minute at most
    loop.step()  # takes the lease, passes over an empty queue
    assert loop.leading
    loop.start()
    try:
        job_id = _submit(client, 1)
        # Placed long before the minute is up: the API nudged the leader.
        wait_until(lambda: _job(settings, job_id).status == "running", 60, what="the job to be placed")
    finally:
        loop.stop()
        loop.join(5)


def test_a_wait_with_under_a_millisecond_left_returns_on_time(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    """Redis 6 reads a BLPOP timeout under 1 ms as 0, "block until a nudge": a pass that left the loop microseconds
    to wait stopped scheduling until the next submission (a preempted job sat queued for five minutes). Against the
    tests' real redis-server, waits of every short length return within their interval. (The wait reads no database:
    one run, not one per database.)"""
    import threading
    import time

    from jobs.scheduling.scheduler import SchedulerLoop

    settings = make_settings(tmp_path, sqlite_url, redis_url)
    loop = SchedulerLoop(settings, LEADER, Redis.from_url(settings.redis_url), interval_s=0.0005)
    loop.leading = True  # only the leader waits on the nudge list
    for _ in range(20):
        started = time.monotonic()
        waiter = threading.Thread(target=loop.wait, daemon=True)
        waiter.start()
        waiter.join(5)
        assert not waiter.is_alive(), "the scheduler's wait blocked past its interval"
        assert time.monotonic() - started < 2


@given(st.floats(min_value=-1.0, max_value=3600.0, allow_nan=False))
def test_the_nudge_wait_is_never_under_10_ms_nor_over_a_second(left: float) -> None:
    from jobs.scheduling.scheduler import nudge_wait_s

    wait = nudge_wait_s(left)
    assert 0.01 <= wait <= 1.0
    assert wait == left or left < 0.01 or left > 1.0


def test_a_standby_asks_for_the_lease_a_few_times_per_ttl_and_takes_a_released_one(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby cannot take the lease before it lapses: it asks every TTL/10, not every period (each refused try is
    a write and a rollback, from every host but one). A clean stop releases it and the standby takes it then."""
    import time

    from jobs.scheduling.scheduler import SchedulerLoop
    from tests.helpers import wait_until

    settings = settings.model_copy(update={"lease_ttl_s": 2.0})
    every_s = settings.lease_ttl_s / 10  # how often a standby may ask
    redis = Redis.from_url(settings.redis_url)
    holder, standby = SchedulerLoop(settings, LEADER, redis, interval_s=0.01), SchedulerLoop(settings, "b", redis, interval_s=0.01)
    holder.step()
    assert holder.leading
    asked: list[str] = []
    hold = leader.hold
    monkeypatch.setattr(leader, "hold", lambda s, name, who, ttl: asked.append(who) or hold(s, name, who, ttl))
    started = time.monotonic()
    for _ in range(30):  # thirty periods, in well under ``every_s`` on an idle machine
        standby.step()
    # At most one try per ``every_s`` (one more for the edge), however long a loaded machine took over the thirty.
    assert not standby.leading and 1 <= asked.count("b") <= (time.monotonic() - started) / every_s + 1
    first_burst = asked.count("b")
    holder.stop()  # gives the lease up
    started = time.monotonic()

    def taken() -> bool:
        standby.step()
        time.sleep(0.01)
        return standby.leading

    wait_until(taken, 60, interval_s=0, what="the standby to take the released lease")
    # At most one try per ``every_s`` since the release (two more for the edges), however long a loaded machine took.
    assert asked.count("b") - first_burst <= (time.monotonic() - started) / every_s + 2
    standby.stop()
