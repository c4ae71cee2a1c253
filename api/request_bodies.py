"""Request bodies of the HTTP API that are not job specs: an API key to create, a job's new priority, a quota.

Each refuses fields it does not know (422 naming them), as the job spec does."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StringConstraints

from jobspec.spec import NAME_PATTERN


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    owner: str = Field(..., pattern=NAME_PATTERN, description="Tenant the key acts for; every job it submits belongs to it.")
    # No control characters: PostgreSQL text refuses NUL, and a name is shown in tables and logs.
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$",
                      description="What the key is for, e.g. 'ci' or 'alice laptop'; no control characters.")
    queues: list[Annotated[str, StringConstraints(pattern=NAME_PATTERN)]] | None = Field(
        None, max_length=64,
        description="Queues the key may submit to, each one of TORCHYARD_QUEUES; omitted or null: all of them.",
    )
    max_priority: StrictInt = Field(50, ge=0, le=100, description="The highest job priority the key may submit at.")
    may_protect: StrictBool = Field(False, description="Whether the key may submit jobs with preemptible: false.")


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 80 and 80.0 are one number, "80" and true are none."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class JobUpdate(BaseModel):
    """What may change on a job once submitted: its priority, while it is queued or running."""

    model_config = ConfigDict(extra="forbid")

    priority: Annotated[StrictInt, BeforeValidator(_whole_number)] = Field(
        ..., ge=0, le=100, description="0-100, at most the key's max_priority; higher goes first and may preempt lower-priority jobs.")


class QuotaIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: StrictInt | None = Field(None, ge=0, le=100_000, description="GPUs guaranteed to the owner; null: no limit.")
    cpu_slots: StrictInt | None = Field(None, ge=0, le=1_000_000, description="CPU slots guaranteed to the owner; null: no limit.")
