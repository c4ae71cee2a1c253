"""All configuration, from ``TORCHYARD_*`` environment variables. No other module reads the environment for settings."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trainer.spec import SpecLimits


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TORCHYARD_", env_file=None, extra="ignore")

    database_url: str = Field("sqlite:///./var/torchyard.db", description="SQLAlchemy URL; PostgreSQL as postgresql+psycopg://...")
    redis_url: str = "redis://localhost:6379/0"
    runs_dir: Path = Path("./var/runs")
    data_dir: Path = Path("./var/data")
    code_dir: Path = Path("./var/code")
    admin_token: str | None = Field(None, description="Bearer token of the admin owner; required by the API.")

    worker_queues: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["default"])
    worker_id: str | None = Field(None, description="Defaults to hostname:pid.")
    max_nproc_per_node: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    max_nnodes: int = Field(64, ge=1)

    lease_ttl_s: float = Field(30.0, gt=0)
    poll_interval_s: float = Field(0.5, gt=0, description="Supervisor loop period: tail events, heartbeat, check cancel.")
    stop_grace_s: float = Field(30.0, ge=0, description="SIGTERM to SIGKILL, time for the trainer to checkpoint.")
    ingest_batch: int = Field(500, ge=1)
    max_worker_losses: int = Field(3, ge=0, description="Lost workers a job survives (requeued, no retry spent) before it fails.")

    # Multi-node jobs (worker/gang.py, docs/multinode.md).
    worker_host: str | None = Field(
        None, description="Address other workers reach this one at (rendezvous endpoint of the gangs it leads); "
                          "default: this host name's address.")
    gang_assemble_timeout_s: float = Field(60.0, gt=0, description="How long a gang leader holds its worker waiting "
                                                                   "for the other nodes before it lets go and requeues.")
    gang_join_timeout_s: float = Field(60.0, gt=0, description="torchrun's c10d rendezvous join timeout on every node.")

    # HTTP API limits and streaming (api/).
    max_request_bytes: int = Field(1_048_576, ge=1024, description="Request bodies above this many bytes answer 413.")
    max_queued_per_owner: int = Field(1000, ge=1, description="Queued jobs one owner may have; more submissions answer 429.")
    max_running_per_owner: int = Field(100, ge=1, description="Running jobs one owner may have; further jobs wait in the queue.")
    sse_poll_interval_s: float = Field(0.5, gt=0, le=60, description="How often event and log streams poll SQL and files.")
    log_format: Literal["json", "text"] = Field("json", description="json: one object per line with job_id and request_id.")

    @field_validator("worker_queues", mode="before")
    @classmethod
    def _split_queues(cls, value: object) -> object:
        if isinstance(value, str):
            return [q.strip() for q in value.split(",") if q.strip()]
        return value

    def spec_limits(self) -> SpecLimits:
        return SpecLimits(max_nproc_per_node=self.max_nproc_per_node, max_nnodes=self.max_nnodes, data_dir=self.data_dir,
                          code_dir=self.code_dir)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
