"""The state machine: guarded transitions, terminal states, races with exactly one winner."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Job, Status, Transition
from jobs.store.states import TransitionRefused, transition


def _job(settings: Settings) -> str:
    with Session(get_engine(settings.database_url)) as session:
        job = Job(owner="admin", name="t", spec={})
        session.add(job)
        session.commit()
        return job.id


def test_transitions_are_guarded_and_recorded(settings: Settings) -> None:
    job_id = _job(settings)
    with Session(get_engine(settings.database_url)) as session:
        transition(session, job_id, Status.RUNNING, reason="started")
        with pytest.raises(TransitionRefused):
            transition(session, job_id, Status.RUNNING, expect=[Status.QUEUED])
        job = transition(session, job_id, Status.SUCCEEDED, reason="done")
        assert job.status == "succeeded" and job.finished_at is not None
        for to in Status:
            with pytest.raises(TransitionRefused):
                transition(session, job_id, to)
        rows = session.exec(sa.select(Transition).where(Transition.job_id == job_id).order_by(Transition.id)).scalars().all()
        history = [(r.from_status, r.to_status, r.reason) for r in rows]
        assert history == [("queued", "running", "started"), ("running", "succeeded", "done")]


def test_racing_cancel_and_start_have_exactly_one_winner(settings: Settings) -> None:
    engine = get_engine(settings.database_url)
    for _ in range(10):
        job_id = _job(settings)
        barrier = threading.Barrier(2)
        results: dict[str, bool] = {}

        def attempt(to: Status, results: dict[str, bool] = results, job_id: str = job_id, barrier: threading.Barrier = barrier) -> None:
            with Session(engine) as session:
                barrier.wait()
                try:
                    transition(session, job_id, to, expect=[Status.QUEUED])
                    results[to.value] = True
                except TransitionRefused:
                    results[to.value] = False

        threads = [threading.Thread(target=attempt, args=(s,)) for s in (Status.RUNNING, Status.CANCELLED)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True]
        with Session(engine) as session:
            final = session.get(Job, job_id)
            assert final is not None
            winner = next(k for k, v in results.items() if v)
            assert final.status == winner
            count = session.exec(sa.select(sa.func.count()).select_from(Transition).where(Transition.job_id == job_id)).scalar_one()
            assert count == 1
