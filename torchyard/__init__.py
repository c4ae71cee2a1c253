"""torchyard for your own code: the reporting SDK and the API client under the product's name.

    from torchyard import report          # inside a job: metrics, checkpoints, resume_path()
    from torchyard import Client          # anywhere: submit, watch, download

``torchyard.integrations`` holds one-line adapters for Lightning, the Hugging Face Trainer and Accelerate.
The same objects stay importable as ``trainer.report`` and ``client.Client``; these names work even
where your own ``trainer.py`` or ``client.py`` shadows those.
"""

from __future__ import annotations

import sys
from typing import Any

from torchyard import _own

_SDK = ["trainer.report", "trainer.sinks.tensorboard", "trainer.sinks.mlflow"]
report = _own.load("trainer", _SDK)[0]
sys.modules[__name__ + ".report"] = report

_CLIENT_NAMES = frozenset({
    "Client", "ClientConfig", "ApiError", "Conflict", "ConnectionFailed", "Forbidden", "InvalidRequest", "NotFound",
    "TorchyardError", "Unauthorized", "UsageRow", "Job", "Checkpoint", "MetricPoint", "load_config", "load_spec", "pack",
})

__all__ = ["report", *sorted(_CLIENT_NAMES)]


def __getattr__(name: str) -> Any:
    # The client (httpx, pydantic) loads on first use: a training rank that only reports never pays for it.
    if name in _CLIENT_NAMES or name == "client":
        client = _own.load("client", ["client"])[0]
        sys.modules[__name__ + ".client"] = client
        return client if name == "client" else getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
