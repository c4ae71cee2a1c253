"""SQL tables. The job table is the source of truth; Redis only carries work and live signals."""

from __future__ import annotations

import functools
import secrets
import time
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator
from sqlmodel import JSON, Column, Field, SQLModel

from jobs.settings import get_settings


def utcnow() -> datetime:
    """This host's UTC time; skewed by TORCHYARD_CLOCK_OFFSET_S (a test's stand-in for a host whose clock is off).
    Leases never use it: they are stamped and compared with the database's clock (jobs/infra/clock.py)."""
    return datetime.now(timezone.utc) + _clock_offset()


@functools.lru_cache(maxsize=1)
def _clock_offset() -> timedelta:
    return timedelta(seconds=get_settings().clock_offset_s)


def new_job_id() -> str:
    # Millisecond prefix keeps ids sortable by creation time, which cursor pagination relies on.
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on both SQLite (which has no time zones) and PostgreSQL."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return value.replace(tzinfo=timezone.utc) if value is not None else None


def _ts(nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


class Status(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})


class ErrorType(str, Enum):
    SPEC = "spec_error"
    OOM = "out_of_memory"
    TRAINING = "training_error"
    USER_CODE = "user_code_error"
    TIMEOUT = "timeout"
    WORKER_LOST = "worker_lost"
    PREEMPTED = "preempted"
    STALLED = "stalled"
    SETUP = "setup_error"  # the job's code bundle or requirements could not be made ready
    CANCELLED_BY_ENGINE = "engine_cancelled"  # cancelled in Slurm (scancel by an administrator), not through torchyard
    BAD_EVENT = "bad_event"  # events.jsonl held a line the service cannot store (names the line)
    DISK_FULL = "disk_full"  # no space left while preparing the run (names the path)
    INTERNAL = "internal_error"
    DEPENDENCY_FAILED = "dependency_failed"  # a job in its depends_on failed or was cancelled: it never ran
    DEVICE_FAULT = "device_fault"  # the failing rank's GPU failed (jobs/hosts/gpu_faults.py): counted against that GPU


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.Index("ix_jobs_owner_id", "owner", "id"), sa.Index("ix_jobs_status_queue", "status", "queue"),
        sa.Index("ix_jobs_owner_status", "owner", "status"),  # the per-owner caps count by status
    )

    id: str = Field(default_factory=new_job_id, primary_key=True, max_length=32)
    owner: str = Field(index=True, max_length=64)
    name: str = Field(index=True, max_length=64)
    kind: str = Field(default="catalog", max_length=16)
    status: str = Field(default=Status.QUEUED.value, max_length=16)
    queue: str = Field(default="default", max_length=64)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    labels: dict[str, str] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))

    attempt: int = 1
    max_attempts: int = 1
    # A retry of a finished job is a new job that starts from the old one's latest checkpoint.
    retry_of: str | None = Field(default=None, max_length=32, index=True)
    resume_from: str | None = Field(default=None, max_length=1024)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    updated_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()

    worker_id: str | None = Field(default=None, max_length=128)
    # What the executor calls the running attempt (the Slurm job id); None under the local executor.
    executor_id: str | None = Field(default=None, max_length=64)
    run_dir: str | None = Field(default=None, max_length=1024)
    lease_expires_at: datetime | None = _ts(index=True)

    last_seq: int = 0
    last_step: int | None = None
    latest_metrics: dict[str, float] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))

    exit_code: int | None = None
    error_type: str | None = Field(default=None, max_length=32)
    error_message: str | None = Field(default=None, sa_column=Column(sa.Text))
    error_traceback: str | None = Field(default=None, sa_column=Column(sa.Text))
    error_log_tail: str | None = Field(default=None, sa_column=Column(sa.Text))
    # What the service changed in the spec between attempts (train.auto_micro_batch after an OOM), oldest first.
    adjustments: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]"))
    # Where the current attempt runs: [{"node_rank", "host", "gpus", "cpu_slots"}], node 0 first; None while queued.
    placement: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # A queued job's place in line (1-based) and what holds it, as the scheduler's last pass stored them.
    queue_position: int | None = None
    waiting_reason: str | None = Field(default=None, sa_column=Column(sa.Text))
    # Higher goes first (0-100); a job that is not preemptible is never stopped to make room for another.
    priority: int = Field(default=50, sa_column=Column(sa.Integer, nullable=False, server_default="50"))
    preemptible: bool = Field(default=True, sa_column=Column(sa.Boolean, nullable=False, server_default=sa.true()))
    # The running attempt was placed beyond its owner's quota: an owner within its quota may take the GPUs back.
    borrowed: bool = Field(default=False, sa_column=Column(sa.Boolean, nullable=False, server_default=sa.false()))
    # Set on a running job that must make room (jobs/scheduling/stops.py): its supervisor stops the ranks with the grace to
    # checkpoint and puts it back in line with these words as its waiting reason, spending no retry.
    stop_request: str | None = Field(default=None, sa_column=Column(sa.Text))
    # While set, the scheduler leaves this queued job where it is; the words are its waiting reason.
    hold: str | None = Field(default=None, sa_column=Column(sa.Text))


class Host(SQLModel, table=True):
    """A worker's host: the devices it owns, and when it last said it is alive (the database's clock)."""

    __tablename__ = "hosts"

    id: str = Field(primary_key=True, max_length=128)
    gpus: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    cpu_slots: int = 0
    queues: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    executor: str = Field(default="local", max_length=16)
    # Where other hosts reach this one (the rendezvous endpoint of the gangs whose node 0 runs here).
    address: str | None = Field(default=None, max_length=255)
    registered_at: datetime | None = _ts()
    last_seen: datetime | None = _ts(index=True)
    # Set: nothing new is placed here (draining; drained once nothing runs here). Kept across worker restarts.
    drain_reason: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))
    # Who drained it: an owner (the admin) or 'health-check' (worker/health.py undrains only its own drains).
    drained_by: str | None = Field(default=None, max_length=64)


class HostGpu(SQLModel, table=True):
    """One GPU's health: device faults since its last success, and its quarantine (never placed until cleared)."""

    __tablename__ = "host_gpus"

    host_id: str = Field(primary_key=True, max_length=128)
    gpu: int = Field(primary_key=True)
    faults: int = 0
    quarantine_reason: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))


class HostEvent(SQLModel, table=True):
    """A host's history: every drain, undrain, quarantine and clear, with who did it (what admin webhooks send)."""

    __tablename__ = "host_events"
    __table_args__ = (sa.Index("ix_host_events_host_id_id", "host_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    host_id: str = Field(max_length=128)
    at: datetime | None = _ts()
    kind: str = Field(max_length=16)  # drain, undrain, quarantine, clear
    gpu: int | None = None
    reason: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))
    actor: str = Field(max_length=64)  # the owner of the key, 'health-check' or 'device-fault'


class Quota(SQLModel, table=True):
    """An owner's guaranteed share of the hosts; None: no limit on that resource. Beyond it, idle devices are lent."""

    __tablename__ = "quotas"

    owner: str = Field(primary_key=True, max_length=64)
    gpus: int | None = None
    cpu_slots: int | None = None
    updated_at: datetime | None = _ts()


class Lease(SQLModel, table=True):
    """A named lease held by one process at a time (the scheduler's leader), stamped with the database's clock."""

    __tablename__ = "leases"

    name: str = Field(primary_key=True, max_length=64)
    holder: str = Field(max_length=128)
    expires_at: datetime | None = _ts()


class OwnerCounter(SQLModel, table=True):
    """An owner's queued jobs, counted as they change, so the queued-job cap is one conditional UPDATE of this row
    instead of a COUNT under a per-owner lock. Moved in the same transaction as every insert of a queued job
    (jobs.lifecycle.submission) and every status change into or out of ``queued`` (jobs.store.states.transition)."""

    __tablename__ = "owner_counters"

    owner: str = Field(primary_key=True, max_length=64)
    queued: int = 0


class Transition(SQLModel, table=True):
    __tablename__ = "job_transitions"
    # A job's transitions in order (details, the event feed's polls) are one index range.
    __table_args__ = (sa.Index("ix_job_transitions_job_id_id", "job_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=32)
    at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    from_status: str = Field(max_length=16)
    to_status: str = Field(max_length=16)
    attempt: int
    reason: str = Field(default="", sa_column=Column(sa.Text, nullable=False))


class Attempt(SQLModel, table=True):
    """One whole-job attempt: a torchrun launch (with its own in-attempt restarts)."""

    __tablename__ = "job_attempts"

    job_id: str = Field(foreign_key="jobs.id", primary_key=True, max_length=32)
    attempt: int = Field(primary_key=True)
    worker_id: str | None = Field(default=None, max_length=128)
    executor_id: str | None = Field(default=None, max_length=64)
    started_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    finished_at: datetime | None = _ts()
    outcome: str | None = Field(default=None, max_length=16)
    exit_code: int | None = None
    error_type: str | None = Field(default=None, max_length=32)
    error_message: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))  # what ended it
    resumed_from_step: int | None = None
    placement: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    note: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))  # how it started, for the user


class MetricPoint(SQLModel, table=True):
    """One metric value at one step. Keyed by step, not seq, so a resumed attempt that
    replays steps after its checkpoint overwrites instead of duplicating."""

    __tablename__ = "job_metrics"
    # The event feed reads points by seq; the primary key serves (job_id, name, step).
    __table_args__ = (sa.Index("ix_job_metrics_job_seq", "job_id", "seq"), sa.Index("ix_job_metrics_job_step", "job_id", "step", "name"))

    job_id: str = Field(foreign_key="jobs.id", primary_key=True, max_length=32)
    name: str = Field(primary_key=True, max_length=128)
    step: int = Field(primary_key=True)
    epoch: int | None = None
    value: float
    time: float
    seq: int


class Checkpoint(SQLModel, table=True):
    __tablename__ = "job_checkpoints"
    __table_args__ = (sa.Index("ix_job_checkpoints_job_seq", "job_id", "seq"),)

    job_id: str = Field(foreign_key="jobs.id", primary_key=True, max_length=32)
    step: int = Field(primary_key=True)
    epoch: int | None = None
    path: str = Field(max_length=1024)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    seq: int
    details: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class ApiKey(SQLModel, table=True):
    """A tenant's API key. Only a SHA-256 digest of the secret is stored: the secret is random
    and long, so a slow password hash would add latency to every request and no safety."""

    __tablename__ = "api_keys"

    id: str = Field(primary_key=True, max_length=32)
    owner: str = Field(index=True, max_length=64)
    name: str = Field(max_length=128)
    key_hash: str = Field(max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    revoked_at: datetime | None = _ts()
    # The queues this key may submit to; None: every queue of TORCHYARD_QUEUES.
    queues: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # The highest priority this key may submit at, and whether it may submit jobs that are not preemptible.
    max_priority: int = Field(default=50, sa_column=Column(sa.Integer, nullable=False, server_default="50"))
    may_protect: bool = Field(default=False, sa_column=Column(sa.Boolean, nullable=False, server_default=sa.false()))


class JobSecret(SQLModel, table=True):
    """A job's secrets, apart from its spec: one Fernet token holding the JSON of name -> value.

    Only the names are stored in clear (responses show them); the values are decrypted by the
    worker alone, into the ranks' environment. A retried job gets a copy of the same token."""

    __tablename__ = "job_secrets"

    job_id: str = Field(foreign_key="jobs.id", primary_key=True, max_length=32)
    names: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    token: str = Field(sa_column=Column(sa.Text, nullable=False))


class IdempotencyKey(SQLModel, table=True):
    """An ``Idempotency-Key`` of ``POST /v1/jobs``, scoped to its owner. The primary key makes
    concurrent duplicates collide in SQL, so exactly one of them creates a job."""

    __tablename__ = "idempotency_keys"

    owner: str = Field(primary_key=True, max_length=64)
    key: str = Field(primary_key=True, max_length=255)
    request_hash: str = Field(max_length=64)
    job_id: str = Field(foreign_key="jobs.id", max_length=32)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class JobUid(SQLModel, table=True):
    """A uid leased to one attempt of a job (worker/sandbox/job_users.py). The primary key makes two workers that pick
    the same uid collide in SQL, so a uid runs one attempt at a time across every worker of the runs volume."""

    __tablename__ = "job_uids"

    uid: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    job_id: str = Field(max_length=32, index=True)
    attempt: int
    worker_id: str = Field(max_length=128)
    acquired_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class Sweep(SQLModel, table=True):
    """A hyperparameter search (jobs/sweeps): its request as accepted, and what the controller made of it so far."""

    __tablename__ = "sweeps"
    __table_args__ = (sa.Index("ix_sweeps_owner_id", "owner", "id"), sa.Index("ix_sweeps_status", "status"),
                      # Concurrent creations with one Idempotency-Key collide here: exactly one sweep is made.
                      sa.UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"))

    id: str = Field(default_factory=new_job_id, primary_key=True, max_length=32)
    owner: str = Field(max_length=64)
    name: str = Field(max_length=64)
    status: str = Field(default="running", max_length=16)  # running | succeeded | failed | cancelled
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    updated_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    finished_at: datetime | None = _ts()
    best_trial: int | None = None
    best_value: float | None = None
    message: str | None = Field(default=None, sa_column=Column(sa.Text))
    idempotency_key: str | None = Field(default=None, max_length=255)
    request_hash: str | None = Field(default=None, max_length=64)


class SweepTrial(SQLModel, table=True):
    """One trial of a sweep: its parameters, its job, and its place in successive halving. ``allowed_rung`` only
    grows, one guarded UPDATE per promotion, so a controller restarted mid-sweep promotes nothing twice."""

    __tablename__ = "sweep_trials"

    sweep_id: str = Field(foreign_key="sweeps.id", primary_key=True, max_length=32)
    number: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    job_id: str | None = Field(default=None, max_length=32, index=True)
    params: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    # pending (no job yet) | running | paused | promoted | stopped | succeeded | failed | cancelled
    state: str = Field(default="pending", max_length=16)
    allowed_rung: int = 0  # starts at its bracket's first rung (jobs.sweeps.asha.bracket_of: recomputed, not stored)
    rung_values: dict[str, float] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    last_value: float | None = None
    best_value: float | None = None
    last_step: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    updated_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
