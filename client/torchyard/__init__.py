"""torchyard for your own code: the reporting SDK, the API client and the CLI under the product's name.

    from torchyard import report          # inside a job: metrics, checkpoints, resume_path()
    from torchyard import Client          # anywhere: submit, watch, download

``torchyard.integrations`` holds one-line adapters for Lightning, the Hugging Face Trainer and Accelerate;
``torchyard.cli`` is the ``torchyard`` command. This package is the whole client install (``pip install
torchyard``): it imports no torch and nothing of the service.
"""

from __future__ import annotations

import importlib
from typing import Any

from torchyard.version import VERSION as __version__

_CLIENT_NAMES = frozenset({
    "Client", "ClientConfig", "ApiError", "Conflict", "ConnectionFailed", "Forbidden", "InvalidRequest", "NotFound",
    "TorchyardError", "Unauthorized", "UsageRow", "Job", "Checkpoint", "MetricPoint", "load_config", "load_spec", "pack",
})

__all__ = ["__version__", "report", *sorted(_CLIENT_NAMES)]


def __getattr__(name: str) -> Any:
    # Loaded on first use: a training rank that only reports never pays for the client (httpx, pydantic),
    # and the CLI never pays for the SDK.
    if name == "report":
        return importlib.import_module("torchyard.report")
    if name in _CLIENT_NAMES:
        return getattr(importlib.import_module("torchyard.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
