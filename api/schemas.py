"""Response models of the HTTP API."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from jobs.models import Checkpoint, Job, MetricPoint


class JobError(BaseModel):
    type: str | None = Field(
        description="spec_error, out_of_memory, training_error, user_code_error, timeout, worker_lost, preempted, stalled",
    )
    message: str | None
    exit_code: int | None
    traceback: str | None = Field(description="Root-cause rank's traceback from the torchrun error file.")
    log_tail: str | None = Field(None, description="Last lines of the failing rank's log.")


class JobOut(BaseModel):
    id: str
    name: str
    owner: str
    kind: str
    status: str
    queue: str
    labels: dict[str, str]
    spec: dict[str, Any]
    attempt: int
    max_attempts: int
    retry_of: str | None = Field(None, description="The finished job this one retries.")
    resume_from: str | None = Field(None, description="Checkpoint this job started from.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    run_dir: str | None
    last_step: int | None
    latest_metrics: dict[str, float]
    error: JobError | None
    queue_position: int | None = Field(None, description="0-based place in the queue while queued.")

    @classmethod
    def of(cls, job: Job, queue_position: int | None = None) -> JobOut:
        error = None
        if job.error_type or job.error_message or job.exit_code not in (None, 0):
            error = JobError(type=job.error_type, message=job.error_message, exit_code=job.exit_code,
                             traceback=job.error_traceback, log_tail=job.error_log_tail)
        data = job.model_dump(exclude={"error_type", "error_message", "error_traceback", "error_log_tail", "exit_code",
                                       "last_seq", "lease_expires_at"})
        return cls(**data, error=error, queue_position=queue_position)


class JobList(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class MetricOut(BaseModel):
    step: int
    epoch: int | None
    name: str
    value: float
    time: float

    @classmethod
    def of(cls, point: MetricPoint) -> MetricOut:
        return cls(step=point.step, epoch=point.epoch, name=point.name, value=point.value, time=point.time)


class MetricList(BaseModel):
    items: list[MetricOut]
    next_cursor: str | None


class CheckpointOut(BaseModel):
    step: int
    epoch: int | None
    path: str = Field(description="Absolute path on the shared runs volume.")
    created_at: datetime
    details: dict[str, Any]

    @classmethod
    def of(cls, ckpt: Checkpoint, run_dir: str | None) -> CheckpointOut:
        path = str(Path(run_dir) / ckpt.path) if run_dir else ckpt.path
        return cls(step=ckpt.step, epoch=ckpt.epoch, path=path, created_at=ckpt.created_at, details=ckpt.details)


class CheckpointList(BaseModel):
    items: list[CheckpointOut]


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
