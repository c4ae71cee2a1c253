"""The live service the CLI tests drive: a real API and worker on SQLite, and the CLI invoked in-process."""

from __future__ import annotations

import traceback

import pytest
from typer.testing import CliRunner

from tests.helpers import Services
from torchyard.cli.main import app


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def live(services: Services) -> Services:
    services.start_api()
    services.start_worker()
    return services


def cli(services: Services, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI in-process against ``services`` with the admin key; ``env`` overrides (another key)."""
    env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": services.headers["Authorization"].removeprefix("Bearer "),
           **(env or {})}
    result = CliRunner().invoke(app, list(args), env=env)
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # An exception the command did not turn into a message: the failing assertion shows where it came from.
        out += "".join(traceback.format_exception(result.exception))
    return result.exit_code, out
