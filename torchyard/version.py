"""The installed package's version: one source (pyproject.toml), read by the CLI, the client's user agent and the API."""

from __future__ import annotations

import importlib.metadata

try:
    VERSION = importlib.metadata.version("torchyard")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "unknown"
