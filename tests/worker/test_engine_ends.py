"""Ends an engine explains, carried through the whole supervisor (adopt, prepare, launch, watch, judge, record)
against real SQL, with an engine that says what a Slurm cluster would: a request it can never schedule fails the job
at once, without a retry; a failed node, and a controller that does not answer the launch, put the job back in line
as a lost worker, without spending a retry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from jobs.infra import queue
from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from jobs.store.models import Attempt, ErrorType, Job, Status
from jobs.store.states import transition
from tests.api.conftest import ADMIN, mlp_spec
from tests.conftest import make_settings
from worker import supervisor
from worker.executors.base import EngineReason, Launch, LaunchError, LaunchRequest, Phase, RankState


class Engine:
    """An executor whose engine reports ``state`` at every poll; it refuses the launch where ``refuse`` is set."""

    name, allocates_nodes = "engine", False

    def __init__(self, state: RankState, refuse: LaunchError | None = None):
        self.state, self.refuse, self.stopped = state, refuse, False

    def start(self, request: LaunchRequest) -> Launch:
        if self.refuse is not None:
            raise self.refuse
        return Launch(request, "engine-1", request.log_dir / "launcher.log")

    def poll(self, launch: Launch) -> RankState:
        return self.state

    def stop(self, launch: Launch, grace_s: float, on_wait: Callable[[], None] | None = None) -> RankState:
        self.stopped = True
        return RankState(Phase.GONE)

    def kill(self, launch: Launch) -> None:
        self.stopped = True

    def release(self, launch: Launch) -> None:
        pass

    def attach(self, request: LaunchRequest, executor_id: str) -> Launch:
        raise LaunchError("cannot attach", transient=False)


def _placed(settings: Settings) -> str:
    """A job the scheduler placed on host-a at attempt 1, as the supervisor finds it."""
    init_db(get_engine(settings.database_url))
    with TestClient(create_app(settings), headers=ADMIN) as client:
        resp = client.post("/v1/jobs", json=mlp_spec(parallel={"strategy": "ddp", "nproc_per_node": 1}, retries=2))
        assert resp.status_code == 201, resp.text
        job_id: str = resp.json()["id"]
    run_dir = settings.runs_dir / job_id
    run_dir.mkdir(parents=True)
    with Session(get_engine(settings.database_url), expire_on_commit=False) as s:
        transition(s, job_id, Status.RUNNING, expect=[Status.QUEUED], reason="placed on host-a",
                   values={"worker_id": "host-a", "run_dir": str(run_dir.resolve())})
        s.merge(Attempt(job_id=job_id, attempt=1, worker_id=None))
        s.commit()
    return job_id


def _supervise(settings: Settings, job_id: str, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Job, Attempt]:
    monkeypatch.setattr(supervisor, "make_executor", lambda _settings: engine)
    result = supervisor.Supervisor(job_id, 1, settings, get_engine(settings.database_url),
                                   queue.redis_client(settings.redis_url)).run()
    with Session(get_engine(settings.database_url)) as s:
        job, attempt = s.get(Job, job_id), s.get(Attempt, (job_id, 1))
        assert job is not None and attempt is not None
        s.expunge_all()
    return result, job, attempt


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, sqlite_url, redis_url, worker_id="host-a", worker_gpus=0, poll_interval_s=0.05)


def test_a_request_the_engine_can_never_schedule_fails_at_once_without_a_retry(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = _placed(settings)
    engine = Engine(RankState(Phase.PENDING, reason=EngineReason.UNSCHEDULABLE, detail="Reason=PartitionConfig"))
    result, job, attempt = _supervise(settings, job_id, engine, monkeypatch)
    assert result == "failed" and engine.stopped
    assert (job.status, job.attempt, job.error_type) == (Status.FAILED.value, 1, ErrorType.SPEC.value)
    assert job.error_message == "the engine can never run it as asked (Reason=PartitionConfig)"
    assert (attempt.outcome, attempt.error_type) == ("failed", ErrorType.SPEC.value)


@pytest.mark.parametrize("engine", [
    Engine(RankState(Phase.EXITED, None, EngineReason.NODE_FAILURE, "node n3")),
    Engine(RankState(Phase.RUNNING), refuse=LaunchError("slurmctld did not answer", transient=True)),
], ids=["node failure", "controller unreachable"])
def test_a_lost_node_or_an_unreachable_engine_puts_the_job_back_in_line_without_a_retry(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, engine: Engine) -> None:
    job_id = _placed(settings)
    with Session(get_engine(settings.database_url)) as s:
        before = s.get(Job, job_id)
        assert before is not None
        max_attempts = before.max_attempts
    result, job, attempt = _supervise(settings, job_id, engine, monkeypatch)
    assert result == "requeued"
    assert (job.status, job.attempt, job.max_attempts) == (Status.QUEUED.value, 2, max_attempts + 1)
    assert job.error_type == ErrorType.WORKER_LOST.value and job.worker_id is None
    assert (attempt.outcome, attempt.error_type) == ("lost", ErrorType.WORKER_LOST.value)
