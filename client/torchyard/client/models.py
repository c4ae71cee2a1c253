"""Typed views of the API's JSON. Unknown fields are kept (``extra="allow"``) so a newer server
does not break an older client."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE = frozenset({"queued", "running", "cancelling"})

# Default ``samples`` of the catalog datasets, mirrored from jobspec/catalog.py so the client
# stays free of service imports; only used to estimate total steps for progress bars.
_DEFAULT_SAMPLES = {"synthetic-classification": 8192, "synthetic-regression": 8192, "synthetic-lm": 4096}


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class JobError(_Model):
    type: str | None = None
    message: str | None = None
    exit_code: int | None = None
    traceback: str | None = None
    log_tail: str | None = None


class Job(_Model):
    id: str
    name: str
    status: str
    owner: str | None = None
    kind: str | None = None
    queue: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    spec: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)  # names only: the API never returns secret values
    attempt: int = 0
    max_attempts: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker_id: str | None = None
    run_dir: str | None = None
    last_step: int | None = None
    latest_metrics: dict[str, float] = Field(default_factory=dict)
    error: JobError | None = None
    queue_position: int | None = None
    waiting_reason: str | None = None
    priority: int = 50
    preemptible: bool = True
    borrowed: bool = False
    stop_request: str | None = None
    placement: list[dict[str, Any]] | None = None
    transitions: list[dict[str, Any]] = Field(default_factory=list)  # job detail only

    @property
    def preemptions(self) -> list[dict[str, Any]]:
        """The times the job was stopped to make room for another, oldest first (job detail only)."""
        return [t for t in self.transitions if t.get("to_status") == "queued" and "preempted by job" in (t.get("reason") or "")]

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def total_steps(self) -> int | None:
        return expected_total_steps(self.spec)


class JobPage(_Model):
    items: list[Job]
    next_cursor: str | None = None


class MetricPoint(_Model):
    step: int
    epoch: int | None = None
    name: str
    value: float
    time: float


class Checkpoint(_Model):
    step: int
    epoch: int | None = None
    path: str
    created_at: datetime | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    available: bool = True  # False: its files are gone (keep_last pruned it)
    size_bytes: int | None = None
    weights_url: str | None = None


class Artifact(_Model):
    """A file under a job's ``artifacts/`` directory; ``path`` is relative to it."""

    path: str
    size_bytes: int
    modified: datetime | None = None


class CodeBundle(_Model):
    """A stored code bundle (``POST /v1/code``); ``uploaded`` is False when the server already had it."""

    digest: str
    size_bytes: int
    files: int
    created_at: datetime | None = None
    uploaded: bool = False


class ApiKey(_Model):
    id: str
    owner: str
    name: str | None = None
    key: str | None = Field(None, description="The secret; only present in the answer to create.")
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    queues: list[str] | None = Field(None, description="Queues the key may submit to; None: all of them.")
    max_priority: int | None = Field(None, description="The highest job priority the key may submit at.")
    may_protect: bool = Field(False, description="Whether the key may submit jobs that cannot be preempted.")


class HostGpu(_Model):
    index: int
    busy: bool = False
    job_id: str | None = Field(None, description="The job holding it; None when free or another owner's.")
    state: str = Field("ready", description="ready, or quarantined (device faults; an admin clears it).")
    reason: str | None = None


class HostCpuSlots(_Model):
    total: int = 0
    used: int = 0


class UsageRow(_Model):
    """One row of ``GET /v1/usage``: ``owner`` and/or ``day`` as grouped, and what its attempts held."""

    owner: str | None = None
    day: str | None = None
    gpu_hours: float = 0.0
    cpu_slot_hours: float = 0.0
    jobs: int = 0
    attempts: int = 0
    preempted_gpu_hours: float = 0.0


class Quota(_Model):
    """An owner's quota as ``GET /v1/quotas`` shows it: guaranteed devices (None: no limit) and what it holds now."""

    owner: str
    gpus: int | None = None
    cpu_slots: int | None = None
    gpus_used: int = 0
    cpu_slots_used: int = 0
    gpus_borrowed: int = 0


class HostEvent(_Model):
    """One drain, undrain, quarantine or clear of a host (or one of its GPUs)."""

    at: datetime | None = None
    kind: str
    gpu: int | None = None
    reason: str | None = None
    by: str


class Host(_Model):
    """A worker's host as ``GET /v1/hosts`` shows it."""

    id: str
    alive: bool = False
    last_seen: datetime | None = None
    gpus: list[HostGpu] = Field(default_factory=list)
    cpu_slots: HostCpuSlots = Field(default_factory=HostCpuSlots)
    queues: list[str] = Field(default_factory=list)
    executor: str | None = None
    jobs: list[str] = Field(default_factory=list)
    state: str = Field("ready", description="ready, draining (nothing new placed; its jobs make room) or drained.")
    reason: str | None = Field(None, description="Why it is draining or drained.")
    history: list[HostEvent] = Field(default_factory=list, description="Drains, undrains, quarantines and clears "
                                                                       "(GET /v1/hosts/{id} only).")


# ------------------------------------------------------------------ events of GET /v1/jobs/{id}/events


class StatusEvent(_Model):
    type: Literal["status"] = "status"
    id: str | None = None
    status: str
    reason: str | None = None
    at: datetime | float | str | None = None
    attempt: int | None = None


class MetricEvent(_Model):
    type: Literal["metric"] = "metric"
    id: str | None = None
    step: int
    epoch: int | None = None
    values: dict[str, float]
    time: float | None = None


class CheckpointEvent(_Model):
    type: Literal["checkpoint"] = "checkpoint"
    id: str | None = None
    step: int
    epoch: int | None = None
    path: str
    created_at: datetime | float | str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class EndEvent(_Model):
    type: Literal["end"] = "end"
    id: str | None = None
    status: str


class OtherEvent(_Model):
    """An event type this client does not know yet; ``data`` is the raw payload."""

    type: str
    id: str | None = None
    data: Any = None


Event = StatusEvent | MetricEvent | CheckpointEvent | EndEvent | OtherEvent

_EVENT_TYPES: dict[str, type[_Model]] = {"status": StatusEvent, "metric": MetricEvent, "checkpoint": CheckpointEvent, "end": EndEvent}


def parse_event(event_type: str, data: Any, event_id: str | None = None) -> Event:
    cls = _EVENT_TYPES.get(event_type)
    if cls is None or not isinstance(data, dict):
        return OtherEvent(type=event_type, id=event_id, data=data)
    return cls.model_validate({**data, "type": event_type, "id": event_id})  # type: ignore[return-value]


def expected_total_steps(spec: dict[str, Any]) -> int | None:
    """Optimizer steps a catalog job will run, as the trainer computes them (full global batches
    per epoch, times epochs, capped by max_steps); None when the spec does not say enough."""
    train = spec.get("train") or {}
    max_steps = train.get("max_steps")
    data = spec.get("data") or {}
    samples = (data.get("args") or {}).get("samples", _DEFAULT_SAMPLES.get(data.get("name", "")))
    batch = train.get("global_batch_size", 64)
    total = None
    if isinstance(samples, int) and isinstance(batch, int) and batch > 0:
        total = int(train.get("epochs", 1)) * (samples // batch)
    if isinstance(max_steps, int):
        total = min(total, max_steps) if total else max_steps
    return total or None
