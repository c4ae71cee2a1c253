"""The lease an attempt's supervisor holds on its job row, and the fence every one of its writes carries.

The supervisor renews the lease (``lease_expires_at``) by heartbeat. Its database calls are tried again through a blip
only while the lease lasts (0.8 TTL past the last renewal), and a watchdog thread kills the attempt's
processes once that point passes, even while the main thread hangs in a database call: past it the
reconciler may hand the job to another worker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.infra import transient
from jobs.infra.clock import db_now
from jobs.settings import Settings
from jobs.store.models import Attempt, Job, Status, utcnow
from jobs.store.states import TransitionRefused

log = logging.getLogger(__name__)

T = TypeVar("T")


class Lease:
    """One attempt's hold on its job: heartbeat, fence, retried database calls and the watchdog."""

    def __init__(self, job_id: str, worker_id: str, settings: Settings, session: Session):
        self.job_id, self.worker_id = job_id, worker_id
        self.settings, self.session = settings, session
        self.log_extra = {"job_id": job_id}
        self.attempt: int | None = None  # the claimed attempt, a plain value: ORM rows expire on rollback
        # When the lease was last renewed (monotonic); database calls are tried again until 0.8 TTL past it.
        self.ok = time.monotonic()
        self.lost = False
        self.watchdog_fired = False  # the ranks were stopped because the lease went unrenewed
        self._watchdog_done: threading.Event | None = None

    def claim(self, rq_attempt: int) -> Job:
        """Adopt the attempt the scheduler placed here and take its lease: exactly one task does (the attempt's row
        names no worker until then), and only while the job runs this attempt on this host. Raises
        TransitionRefused otherwise. The job comes back detached and fully loaded: a later rollback cannot expire
        it into a query against a dead database."""
        session = self.session

        def claim() -> Job:
            run_dir = (self.settings.runs_dir / self.job_id).resolve()
            placed_here = sa.exists().where(Job.id == self.job_id, Job.attempt == rq_attempt, Job.worker_id == self.worker_id,
                                            Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]))  # type: ignore[attr-defined]
            adopted = session.exec(  # type: ignore[call-overload]
                sa.update(Attempt).where(Attempt.job_id == self.job_id, Attempt.attempt == rq_attempt,
                                         Attempt.worker_id.is_(None), placed_here)  # type: ignore[union-attr]
                .values(worker_id=self.worker_id, started_at=utcnow())).rowcount
            if adopted != 1:
                session.rollback()
                raise TransitionRefused(self.job_id, f"not placed on {self.worker_id} at attempt {rq_attempt}, "
                                                     "or adopted already", Status.RUNNING)
            session.exec(sa.update(Job).where(Job.id == self.job_id, Job.attempt == rq_attempt)  # type: ignore[call-overload]
                         .values(run_dir=str(run_dir), lease_expires_at=db_now(session, self.settings.lease_ttl_s)))
            session.commit()
            job = session.get(Job, self.job_id, populate_existing=True)
            assert job is not None
            return job

        job = self.db(claim, "adopting the attempt")
        self.ok = time.monotonic()
        self.attempt = job.attempt
        session.expunge(job)
        return job

    def fence(self) -> list[object]:
        """Conditions every write of this supervisor carries, checked in its own transaction: the job still runs
        this attempt on this worker. The reconciler's requeue bumps the attempt, so a stale supervisor (frozen,
        partitioned) that wakes up writes nothing."""
        return [Job.attempt == self.attempt, Job.worker_id == self.worker_id,
                Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value])]  # type: ignore[attr-defined]

    def deadline(self) -> float:
        """Monotonic time after which the lease may lapse unseen: stop trying again and stop writing."""
        return self.ok + self.settings.lease_ttl_s * 0.8

    def db(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` retried through transient database and Redis errors while the lease lasts. Between tries the
        session is rolled back and the lease renewed, so a blip shorter than the lease costs nothing."""

        def between_tries() -> None:
            with contextlib.suppress(SQLAlchemyError):
                self.session.rollback()
            self.try_heartbeat()

        def out_of_time() -> bool:
            return self.lost or time.monotonic() >= self.deadline()

        return transient.call(fn, deadline=out_of_time, what=f"job {self.job_id}: {what}", between_tries=between_tries)

    def try_heartbeat(self) -> None:
        """One heartbeat, errors swallowed: a renewal extends the deadline of calls tried again, a refusal ends it."""
        if self.attempt is None:
            return
        try:
            self.heartbeat(self.attempt)
        except SQLAlchemyError:
            with contextlib.suppress(SQLAlchemyError):
                self.session.rollback()

    def heartbeat(self, attempt: int) -> bool:
        """Renew the lease; False (and lost from now on) once the job no longer runs this attempt here."""
        result = self.session.exec(  # type: ignore[call-overload]
            sa.update(Job)
            .where(Job.id == self.job_id, Job.worker_id == self.worker_id, Job.attempt == attempt,
                   Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]))  # type: ignore[attr-defined]
            .values(lease_expires_at=db_now(self.session, self.settings.lease_ttl_s))
        )
        self.session.commit()
        if result.rowcount == 1:
            self.ok = time.monotonic()
            return True
        self.lost = True
        return False

    def start_watchdog(self, kill: Callable[[], None]) -> None:
        """Calls ``kill`` once the lease went unrenewed for 0.8 TTL, even while the main thread hangs in a
        database call: past that point the reconciler may hand the job to another worker."""
        done = self._watchdog_done = threading.Event()
        limit = self.settings.lease_ttl_s * 0.8

        def watch() -> None:
            while not done.wait(min(0.5, limit / 4)):
                late = time.monotonic() - self.ok
                if late > limit:
                    log.error("job %s: lease not renewed for %.1fs (limit %.1fs); stopping attempt %s's processes",
                              self.job_id, late, limit, self.attempt, extra=self.log_extra)
                    self.watchdog_fired = True
                    kill()
                    return

        threading.Thread(target=watch, name=f"lease-watchdog-{self.job_id}", daemon=True).start()

    def stop_watchdog(self) -> None:
        if self._watchdog_done is not None:
            self._watchdog_done.set()
