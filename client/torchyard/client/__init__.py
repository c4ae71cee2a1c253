"""The typed Python client of the torchyard HTTP API.

    from torchyard.client import Client
    with Client("http://127.0.0.1:8000", key) as c:
        job = c.submit("examples/mlp-ddp.yaml")
        for event in c.stream(job.id):
            ...
        job = c.wait(job.id)
        losses = c.metrics(job.id, "train/loss")
"""

from torchyard.client.client import Client, load_spec
from torchyard.client.config import ClientConfig, ConfigError, load_config
from torchyard.client.errors import (
    ApiError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    NotFound,
    TorchyardError,
    Unauthorized,
)
from torchyard.client.models import (
    ACTIVE,
    TERMINAL,
    ApiKey,
    Checkpoint,
    CheckpointEvent,
    CodeBundle,
    EndEvent,
    Event,
    Host,
    Job,
    JobError,
    JobPage,
    MetricEvent,
    MetricPoint,
    OtherEvent,
    Quota,
    StatusEvent,
    UsageRow,
    expected_total_steps,
)
from torchyard.client.pack import PackError, pack

__all__ = [
    "ACTIVE", "TERMINAL", "ApiError", "ApiKey", "Checkpoint", "CheckpointEvent", "Client", "ClientConfig", "CodeBundle",
    "ConfigError", "Conflict", "ConnectionFailed", "EndEvent", "Event", "Forbidden", "Host", "InvalidRequest", "Job", "JobError",
    "JobPage", "MetricEvent", "MetricPoint", "NotFound", "OtherEvent", "PackError", "Quota", "StatusEvent", "TorchyardError",
    "Unauthorized", "UsageRow", "expected_total_steps", "load_config", "load_spec", "pack",
]
