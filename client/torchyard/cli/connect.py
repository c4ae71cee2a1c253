"""``torchyard login`` and ``torchyard up``: save the URL and key of a service, or run one locally."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from torchyard.cli.main import EXIT_USAGE, _echo_json, _fail, _settings, app, console, handles_errors
from torchyard.client import Client
from torchyard.client.config import DEFAULT_URL, config_path, read_config_file, write_config_file


@app.command()
@handles_errors
def login(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", help="API URL; asked for when not given.", show_default=False)] = None,
    key: Annotated[str | None, typer.Option("--key", help="API key; asked for (hidden) when not given.", show_default=False)] = None,
    verify: Annotated[bool, typer.Option(help="Check the key against the API before saving it.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was saved (without the key) as JSON.")] = False,
) -> None:
    """Save the API URL and key to the config file the CLI and Client.from_config() read."""
    opts = _settings(ctx)
    path = opts.config or config_path()
    saved = read_config_file(path)
    url = url or opts.url or typer.prompt("API URL", default=str(saved.get("url") or DEFAULT_URL))
    opts.key_source = "--key" if key else opts.key_from if opts.key else "typed"
    key = key or opts.key or typer.prompt("API key", hide_input=True)
    url = url.rstrip("/")
    if verify:
        with Client(url, key) as client:
            client.list_jobs(limit=1)  # Unauthorized or ConnectionFailed: nothing is written
    write_config_file(path, url, key)
    if as_json:
        _echo_json({"config": str(path), "url": url, "verified": verify})
        return
    console.print(f"saved {escape(url)} and the key to {escape(str(path))}" + (" (key checked)" if verify else ""))


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Interface the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes; one owns the machine's GPUs and runs several jobs at once.")] = 1,
) -> None:
    """Run the whole service locally: API, worker(s) and a private Redis unless TORCHYARD_REDIS_URL is set (python -m stack)."""
    if importlib.util.find_spec("stack") is None:  # the client install (pip install torchyard) has no service in it
        raise _fail("the service is not installed in this environment, only its client: pip install torchyard-server "
                    "(or `make install` in a checkout of the repository) to run one", EXIT_USAGE)
    argv = [sys.executable, "-m", "stack", "--host", host, "--port", str(port), "--workers", str(workers)]
    url = f"http://{host}:{port}"
    console.print(f"dashboard: [bold]{url}/[/] (sign in with the admin token below)\n"
                  f"CLI:       export TORCHYARD_URL={url} TORCHYARD_API_KEY=<the admin token>")
    sys.stdout.flush()
    # exec, not a child: Ctrl-C and SIGTERM reach the stack runner, which stops its own children.
    os.execv(sys.executable, argv)


