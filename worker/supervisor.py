"""The RQ job function: supervise one attempt of one job, from claim to final status.

start: CAS queued -> running (exactly one supervisor wins), write spec.json, spawn torchrun.
loop:  tail events.jsonl into SQL, heartbeat the lease, watch for cancel and timeout.
exit:  read the error file, then succeeded | failed | queued (retry or preemption).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.engine import Engine
from sqlmodel import Session

from jobs import queue
from jobs.db import get_engine
from jobs.ingest import ingest_events
from jobs.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.settings import Settings, get_settings
from jobs.states import TransitionRefused, transition
from trainer.spec import JobSpec
from worker import outcome, processes
from worker.launch import ERROR_FILE, SPEC_FILE, torchrun_command, torchrun_env
from worker.tail import EventTail

log = logging.getLogger(__name__)

LAUNCHER_LOG = "launcher.log"


def worker_id(settings: Settings) -> str:
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"


def supervise(job_id: str, attempt: int) -> str:
    """Entry point named in every RQ job (see jobs.queue.SUPERVISE)."""
    settings = get_settings()
    engine = get_engine(settings.database_url)
    # RQ forks a work horse per job; connections inherited from the parent must not be shared.
    engine.dispose(close=False)
    return Supervisor(job_id, attempt, settings, engine, queue.redis_client(settings.redis_url)).run()


class Supervisor:
    def __init__(self, job_id: str, attempt: int, settings: Settings, engine: Engine, redis: Redis):
        self.job_id, self.rq_attempt = job_id, attempt
        self.settings, self.engine, self.redis = settings, engine, redis
        self.worker_id = worker_id(settings)
        self.session = Session(engine, expire_on_commit=False)
        self.log_extra = {"job_id": job_id}
        self.last_phase: str | None = None

    # ------------------------------------------------------------ lifecycle

    def run(self) -> str:
        try:
            job = self._claim()
        except TransitionRefused as exc:
            log.info("job %s: not started (%s)", self.job_id, exc, extra=self.log_extra)
            return f"skipped: {exc}"
        try:
            return self._run_attempt(job)
        finally:
            self.session.close()

    def _claim(self) -> Job:
        now = utcnow()
        run_dir = (self.settings.runs_dir / self.job_id).resolve()
        job = transition(
            self.session, self.job_id, Status.RUNNING, expect=[Status.QUEUED], reason=f"started on {self.worker_id}",
            values={
                "worker_id": self.worker_id, "run_dir": str(run_dir),
                "started_at": sa.func.coalesce(Job.started_at, now),
                "lease_expires_at": now + timedelta(seconds=self.settings.lease_ttl_s),
            },
        )
        self.session.merge(Attempt(job_id=job.id, attempt=job.attempt, worker_id=self.worker_id, started_at=now))
        self.session.commit()
        return job

    def _run_attempt(self, job: Job) -> str:
        spec = JobSpec.model_validate(job.spec)
        run_dir = Path(job.run_dir or "")
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(run_dir / SPEC_FILE, json.dumps(job.spec, indent=2))
        (run_dir / ERROR_FILE).unlink(missing_ok=True)
        attempt_logs = run_dir / "logs" / f"attempt-{job.attempt}"
        launcher_log = attempt_logs / LAUNCHER_LOG

        self.tail = EventTail(run_dir / "events.jsonl")
        proc = processes.spawn(
            torchrun_command(spec, run_dir, job.attempt), torchrun_env(job.id, job.attempt, run_dir, self.settings),
            cwd=run_dir, log_path=launcher_log,
        )
        log.info("job %s attempt %d: torchrun pid %d", job.id, job.attempt, proc.pid, extra=self.log_extra)
        started = time.monotonic()
        next_beat = 0.0
        while True:
            self._ingest()
            now = time.monotonic()
            if now >= next_beat:
                if not self._heartbeat(job.attempt):
                    # The reconciler gave the job to someone else: no process of ours may write on.
                    processes.kill_marked(job.id)
                    proc.wait()
                    return "lost ownership"
                next_beat = now + self.settings.lease_ttl_s / 3
            status = self._status()
            if status == Status.CANCELLING:
                processes.stop(proc, job.id, self.settings.stop_grace_s, on_wait=self._ingest)
                self._ingest()
                return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
            if now - started > spec.timeout_s:
                code = processes.stop(proc, job.id, self.settings.stop_grace_s, on_wait=self._ingest)
                self._ingest()
                return self._fail_or_retry(job, outcome.Failure(
                    ErrorType.TIMEOUT, f"attempt exceeded timeout_s={spec.timeout_s}", None, code), retry=False)
            if proc.poll() is not None:
                break
            time.sleep(self.settings.poll_interval_s)

        code = proc.returncode
        processes.kill_marked(job.id)  # strays such as data-loader workers orphaned by a dead rank
        self._ingest()
        if self._status() == Status.CANCELLING:
            return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
        if code == 0:
            return self._finish(job, Status.SUCCEEDED, reason="torchrun exited 0", outcome="succeeded", exit_code=0)
        if outcome.was_preempted(code, self.last_phase):
            return self._requeue(job, reason="preempted; resumes from its checkpoint", outcome_name="preempted",
                                 consume_retry=False, exit_code=code)
        return self._fail_or_retry(job, outcome.failure(code, run_dir / ERROR_FILE, launcher_log))

    # ------------------------------------------------------------ steps

    def _ingest(self) -> None:
        events = self.tail.read()
        for event in events:
            if event.get("type") == "status":
                self.last_phase = event.get("phase")
        for start in range(0, len(events), self.settings.ingest_batch):
            ingest_events(self.session, self.job_id, events[start:start + self.settings.ingest_batch])

    def _heartbeat(self, attempt: int) -> bool:
        expires = utcnow() + timedelta(seconds=self.settings.lease_ttl_s)
        result = self.session.exec(  # type: ignore[call-overload]
            sa.update(Job)
            .where(Job.id == self.job_id, Job.worker_id == self.worker_id, Job.attempt == attempt,
                   Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]))  # type: ignore[attr-defined]
            .values(lease_expires_at=expires)
        )
        self.session.commit()
        return result.rowcount == 1

    def _status(self) -> Status:
        value = self.session.exec(sa.select(Job.status).where(Job.id == self.job_id)).scalar_one()  # type: ignore[call-overload]
        self.session.commit()
        return Status(value)

    def _record_attempt(self, job: Job, outcome_name: str, exit_code: int | None, error_type: str | None) -> None:
        row = self.session.get(Attempt, (job.id, job.attempt))
        if row is not None:
            row.finished_at, row.outcome, row.exit_code, row.error_type = utcnow(), outcome_name, exit_code, error_type
            self.session.add(row)
            self.session.commit()

    def _finish(self, job: Job, to: Status, *, reason: str, outcome: str, exit_code: int | None = None) -> str:
        self._record_attempt(job, outcome, exit_code, None)
        try:
            transition(self.session, job.id, to, expect=[Status.RUNNING, Status.CANCELLING], reason=reason,
                       values={"exit_code": exit_code} if exit_code is not None else None)
        except TransitionRefused as exc:
            log.warning("job %s: final transition refused (%s)", job.id, exc, extra=self.log_extra)
        return to.value

    def _requeue(self, job: Job, *, reason: str, outcome_name: str, consume_retry: bool,
                 exit_code: int | None, error: outcome.Failure | None = None) -> str:
        self._record_attempt(job, outcome_name, exit_code, error.type.value if error else None)
        values: dict[str, object] = {
            "attempt": Job.attempt + 1, "worker_id": None, "lease_expires_at": None, "exit_code": exit_code,
        }
        if not consume_retry:
            values["max_attempts"] = Job.max_attempts + 1
        if error is not None:
            values.update(error_type=error.type.value, error_message=error.message, error_traceback=error.traceback)
        try:
            fresh = transition(self.session, job.id, Status.QUEUED, expect=[Status.RUNNING], reason=reason, values=values)
        except TransitionRefused as exc:
            log.warning("job %s: requeue refused (%s)", job.id, exc, extra=self.log_extra)
            return "requeue refused"
        queue.enqueue(self.redis, fresh)
        return "requeued"

    def _fail_or_retry(self, job: Job, error: outcome.Failure, retry: bool = True) -> str:
        if retry and job.attempt < job.max_attempts:
            return self._requeue(job, reason=f"attempt {job.attempt} failed ({error.type.value}); retrying",
                                 outcome_name="failed", consume_retry=True, exit_code=error.exit_code, error=error)
        self._record_attempt(job, "failed", error.exit_code, error.type.value)
        try:
            transition(self.session, job.id, Status.FAILED, expect=[Status.RUNNING, Status.CANCELLING], reason=error.message[:500],
                       values={"error_type": error.type.value, "error_message": error.message,
                               "error_traceback": error.traceback, "exit_code": error.exit_code})
        except TransitionRefused as exc:
            log.warning("job %s: fail refused (%s)", job.id, exc, extra=self.log_extra)
        return Status.FAILED.value


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["supervise", "Supervisor", "subprocess"]
