"""Response models of the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.reads import job_lookup, job_pages
from jobs.store.models import ApiKey, Job, MetricPoint


class JobError(BaseModel):
    type: str | None = Field(
        description="spec_error, out_of_memory, training_error, user_code_error, timeout, worker_lost, preempted, stalled, "
                    "engine_cancelled, bad_event, disk_full, setup_error, internal_error",
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
    priority: int = Field(50, description="0-100, higher goes first and may preempt lower-priority jobs.")
    preemptible: bool = Field(True, description="false: never stopped to make room for another job.")
    borrowed: bool = Field(False, description="The running attempt was placed beyond its owner's quota on idle devices; "
                                              "an owner within its quota may take them back by preemption.")
    stop_request: str | None = Field(None, description="Why the job was stopped to make room, e.g. 'preempted by job 01ab.. "
                                                       "(priority 80) to make room': set while it checkpoints and leaves, and kept "
                                                       "while it waits to run again.")
    labels: dict[str, str]
    spec: dict[str, Any] = Field(description="The spec as accepted, without secrets. In lists only a summary: kind, parallel, "
                                             "train, model.name, data.name and data.args.samples.")
    secrets: list[str] = Field(default_factory=list, description="Names of the job's secrets; their values are never returned.")
    attempt: int
    max_attempts: int
    retry_of: str | None = Field(None, description="The finished job this one retries.")
    resume_from: str | None = Field(None, description="Checkpoint this job started from.")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    executor_id: str | None = Field(None, description="The running or last attempt's id in its executor: the Slurm job id; "
                                                      "null under the local executor.")
    run_dir: str | None
    last_step: int | None
    latest_metrics: dict[str, float]
    error: JobError | None
    adjustments: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What the service changed in the spec between attempts, oldest first: with train.auto_micro_batch, "
                    "an attempt that ran out of memory is retried with grad_accum_steps doubled ({attempt, reason, field, "
                    "from, to, micro_batch: {from, to}}). The spec shown is the adjusted one.",
    )
    placement: list[dict[str, Any]] | None = Field(
        None, description="Where the current attempt runs: [{node_rank, host, gpus, cpu_slots}], node 0 first; null while queued.")
    queue_position: int | None = Field(None, description="0-based place among the waiting jobs of its queue while queued, as the "
                                                         "scheduler's last pass stored it; null until a pass looked at the job.")
    waiting_reason: str | None = Field(
        None, description="Why a queued job has not started, as the scheduler's last pass stored it, e.g. 'needs 4 GPUs on one "
                          "host; the most free on any host is 2 (gpu-a)' or '2 jobs ahead of it'; null until a pass looked at it.",
    )
    nodes_needed: int | None = Field(None, description="A queued multi-node job: hosts it needs at once (job detail only).")
    workers_free: int | None = Field(None, description="No longer computed (null): GET /v1/hosts shows what is free.")
    attempts: list[AttemptOut] = Field(default_factory=list, description="Whole-job attempts, oldest first (job detail only).")
    transitions: list[TransitionOut] = Field(default_factory=list, description="Status history, oldest first (job detail only).")

    @classmethod
    def of(cls, job: Job, queue_position: int | None = None, **detail: Any) -> JobOut:
        return cls._from_values(job.model_dump(), queue_position=queue_position, **detail)

    @classmethod
    def summary(cls, item: job_pages.JobSummary) -> JobOut:
        """A row of a job list: no full spec, no traceback or log tail (GET /v1/jobs/{id} has them)."""
        return cls._from_values({**item.values, "spec": item.spec}, secrets=item.secret_names)

    @classmethod
    def _from_values(cls, data: dict[str, Any], **extra: Any) -> JobOut:
        error = None
        if data.get("error_type") or data.get("error_message") or data.get("exit_code") not in (None, 0):
            error = JobError(type=data.get("error_type"), message=data.get("error_message"), exit_code=data.get("exit_code"),
                             traceback=data.get("error_traceback"), log_tail=data.get("error_log_tail"))
        hidden = {"error_type", "error_message", "error_traceback", "error_log_tail", "exit_code", "last_seq", "lease_expires_at"}
        return cls(**{**{k: v for k, v in data.items() if k not in hidden}, "error": error, **extra})

    @classmethod
    def detail(cls, d: job_lookup.JobDetail) -> JobOut:
        return cls._from_values(
            dict(d.values), queue_position=d.queue_position, waiting_reason=d.waiting_reason, nodes_needed=d.nodes_needed,
            workers_free=d.workers_free,
            secrets=d.secret_names,
            attempts=[AttemptOut.model_validate(a, from_attributes=True) for a in d.attempts],
            transitions=[TransitionOut.model_validate(t, from_attributes=True) for t in d.transitions],
        )


class AttemptOut(BaseModel):
    attempt: int
    worker_id: str | None
    executor_id: str | None = Field(None, description="The Slurm job id of this attempt; null under the local executor.")
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None = Field(description="succeeded, failed, cancelled, preempted; null while it runs.")
    exit_code: int | None
    error_type: str | None
    error_message: str | None = Field(None, description="What ended this attempt, when it failed or was lost; kept once "
                                                        "the job goes on (a job that succeeds has no top-level error).")
    resumed_from_step: int | None
    placement: list[dict[str, Any]] | None = Field(None, description="Where this attempt ran: [{node_rank, host, gpus, cpu_slots}].")
    note: str | None = Field(None, description="What to know about how it started, e.g. 'resume_args not applied: no "
                                               "checkpoint found under out/*.pt'.")


class TransitionOut(BaseModel):
    at: datetime
    from_status: str
    to_status: str
    attempt: int
    reason: str


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
    available: bool = Field(False, description="The checkpoint's files are still on the runs volume (keep_last deletes old ones).")
    size_bytes: int | None = Field(None, description="Total size of the checkpoint's files; null when not available.")
    weights_url: str | None = Field(
        None, description="Download path of the consolidated weights file (final checkpoints and those saved with weights).",
    )

    @classmethod
    def of(cls, info: job_lookup.CheckpointInfo, job_id: str) -> CheckpointOut:
        ckpt = info.checkpoint
        weights_url = f"/v1/jobs/{job_id}/checkpoints/{ckpt.step}/weights" if info.has_weights else None
        return cls(step=ckpt.step, epoch=ckpt.epoch, path=info.path, created_at=ckpt.created_at, details=ckpt.details,
                   available=info.size_bytes is not None, size_bytes=info.size_bytes, weights_url=weights_url)


class CheckpointList(BaseModel):
    items: list[CheckpointOut]


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class QuotaOut(BaseModel):
    owner: str
    gpus: int | None = Field(description="Guaranteed GPUs; null: no limit.")
    cpu_slots: int | None = Field(description="Guaranteed CPU slots; null: no limit.")
    gpus_used: int = Field(description="GPUs the owner's running jobs hold now.")
    cpu_slots_used: int = Field(description="CPU slots the owner's running jobs hold now.")
    gpus_borrowed: int = Field(description="Of gpus_used, those placed beyond the quota on idle GPUs: taken back when "
                                           "an owner within its quota needs them.")


class QuotaList(BaseModel):
    items: list[QuotaOut]


class UsageRowOut(BaseModel):
    owner: str | None = Field(None, description="Present when grouped by owner.")
    day: str | None = Field(None, description="The UTC day (YYYY-MM-DD); present when grouped by day.")
    gpu_hours: float
    cpu_slot_hours: float
    jobs: int
    attempts: int
    preempted_gpu_hours: float = Field(description="GPU-hours of attempts that ended preempted (their work resumed elsewhere).")


class UsageOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    start: datetime | None = Field(None, alias="from", description="The window's start; null: all time.")
    end: datetime = Field(alias="to", description="The window's end (now at the latest).")
    items: list[UsageRowOut]


class KeyOut(BaseModel):
    id: str
    owner: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    queues: list[str] | None = Field(None, description="Queues the key may submit to; null: all of them.")
    max_priority: int = Field(50, description="The highest job priority the key may submit at.")
    may_protect: bool = Field(False, description="Whether the key may submit jobs that cannot be preempted.")

    @classmethod
    def of(cls, row: ApiKey) -> KeyOut:
        return cls(id=row.id, owner=row.owner, name=row.name, created_at=row.created_at, revoked_at=row.revoked_at,
                   queues=row.queues, max_priority=row.max_priority, may_protect=row.may_protect)


class KeyCreated(KeyOut):
    key: str = Field(description="The secret key. Shown only in this response; store it now.")


class KeyList(BaseModel):
    items: list[KeyOut]


class ProblemItem(BaseModel):
    field: str
    message: str


class Problem(BaseModel):
    """application/problem+json (RFC 9457)."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[ProblemItem] | None = Field(None, description="One entry per invalid field (422 only).")


# ------------------------------------------------------------ payloads of GET /v1/jobs/{id}/events (documentation)


class StatusEventData(BaseModel):
    status: str
    reason: str
    at: datetime
    attempt: int


class MetricEventData(BaseModel):
    step: int
    epoch: int | None
    values: dict[str, float] = Field(description="Metric name to value, e.g. {'train/loss': 1.93}.")
    time: float = Field(description="Unix time the trainer logged it.")


class CheckpointEventData(BaseModel):
    step: int
    epoch: int | None
    path: str = Field(description="Absolute path on the runs volume.")
    created_at: datetime
    details: dict[str, Any]


class EndEventData(BaseModel):
    status: str = Field(description="The job's terminal status.")


class ReconnectEventData(BaseModel):
    reason: str = Field(description="Why the server ends the stream; reconnect with this message's id as Last-Event-ID.")


SSE_PAYLOADS: dict[str, type[BaseModel]] = {
    "status": StatusEventData, "metric": MetricEventData, "checkpoint": CheckpointEventData, "end": EndEventData,
    "reconnect": ReconnectEventData,
}


def sse_event_schema() -> dict[str, Any]:
    """One server-sent event as schemathesis and OpenAPI 3.2 read a text/event-stream: id, event, data."""
    variants = [{
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "description": "Opaque cursor; send it back as Last-Event-ID to resume after this event."},
            "event": {"const": name},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": f"#/components/schemas/{model.__name__}"}},
        },
    } for name, model in SSE_PAYLOADS.items()]
    return {"oneOf": variants}


class HostGpu(BaseModel):
    index: int = Field(description="The GPU's physical index on its host (what CUDA_VISIBLE_DEVICES names).")
    busy: bool = Field(description="Held by a running job.")
    job_id: str | None = Field(description="The job that holds it: shown to its owner and the admin; null to other owners.")
    state: str = Field("ready", description="ready, or quarantined: device faults took it out of placement until an admin clears it.")
    reason: str | None = Field(None, description="Why it is quarantined.")


class HostCpuSlots(BaseModel):
    total: int
    used: int


class HostOut(BaseModel):
    id: str
    alive: bool = Field(description="Its worker heartbeat within one lease (TORCHYARD_LEASE_TTL_S); jobs are placed only on live hosts.")
    last_seen: datetime | None = Field(description="Its worker's last heartbeat (the database's clock); null once it stopped.")
    gpus: list[HostGpu]
    cpu_slots: HostCpuSlots = Field(description="Slots for device-cpu jobs, one per rank.")
    queues: list[str] = Field(description="The queues its worker serves.")
    executor: str = Field(description="local, or slurm (Slurm places the ranks; the host only hands them over).")
    jobs: list[str] = Field(description="The running jobs on it that the caller may see.")
    state: str = Field("ready", description="ready; draining: nothing new is placed here and its jobs are asked to make "
                                            "room; drained: draining with nothing running here any more.")
    reason: str | None = Field(None, description="Why it is draining or drained.")


class HostList(BaseModel):
    items: list[HostOut]


class HostEventOut(BaseModel):
    at: datetime | None
    kind: str = Field(description="drain, undrain, quarantine or clear.")
    gpu: int | None = Field(description="The GPU of a quarantine or clear.")
    reason: str | None
    by: str = Field(description="Who did it: the key's owner (admin), 'health-check' or 'device-fault'.")


class HostDetail(HostOut):
    history: list[HostEventOut] = Field(description="Its drains, undrains, quarantines and clears, oldest first.")


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000, description="Why, as operators and waiting jobs read it.")


class QueuedOut(BaseModel):
    id: str
    name: str
    owner: str
    queue: str
    queue_position: int | None = Field(description="0-based place among the waiting jobs of its queue, as the scheduler's "
                                                    "last pass stored it; null until a pass has looked at the job.")
    waiting_reason: str | None = Field(description="What holds it, with numbers, e.g. 'needs 4 GPUs on one host; the most "
                                                   "free on any host is 2 (gpu-a)'.")
    created_at: datetime
    nnodes: int
    nproc_per_node: int | str
    device: str


class QueueList(BaseModel):
    items: list[QueuedOut]
