"""``torchyard``: the command line of the torchyard service.

Configuration: ``--url`` / ``--key``, else TORCHYARD_URL / TORCHYARD_API_KEY, else
~/.config/torchyard/config.toml (``url = "..."``, ``api_key = "..."``), else http://127.0.0.1:8000.

Exit codes scripts can rely on:

    0  success (with --follow / watch: the job succeeded)
    1  the followed job failed
    2  usage error: bad option, unreadable spec file, bad config file
    3  the followed job was cancelled
    4  the API refused the request (401, 403, 404, 409, 422, other 4xx); its detail is printed
    5  the API could not be reached or answered 5xx
  130  interrupted (Ctrl-C); a followed job keeps running

The commands live in modules of their own (jobs, job_output, job_control, files, hosts, tensorboard, connect, keys,
quota, usage, sweep, webhooks); each registers on ``app`` when it is imported at the end of this one.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from torchyard.client import ApiError, Client, ConfigError, ConnectionFailed, TorchyardError, Unauthorized, load_config
from torchyard.client.config import ENV_KEY, config_path
from torchyard.version import VERSION as __version__

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_JOB_CANCELLED, EXIT_API, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 5, 130

# Piped or captured output (scripts, CI logs) gets wide lines instead of Rich's 80-column default,
# so tables of 24-character job ids do not fold.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(highlight=False, width=_WIDTH)
err = Console(stderr=True, highlight=False, width=_WIDTH)

app = typer.Typer(
    name="torchyard", help="Submit, watch and manage PyTorch training jobs on a torchyard service.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True, context_settings={"help_option_names": ["-h", "--help"]},
)

F = TypeVar("F", bound=Callable[..., Any])
# The JOB_ID argument every per-job command takes.
JobIdArg = Annotated[str, typer.Argument(help="Job id.", show_default=False)]


@dataclass
class CliContext:
    url: str | None
    key: str | None
    config: Path | None
    # Where --key's value came from when it has one: "--key" or "TORCHYARD_API_KEY" (typer reads both into it).
    key_from: str | None = None
    # Where the key in use came from, once resolved: "--key", "TORCHYARD_API_KEY", a config file, "typed", "none".
    key_source: str | None = None
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            cfg = load_config(self.url, self.key, self.config)
            self.key_source = self.key_from if cfg.source == "argument" and self.key_from else cfg.source
            self._client = Client(cfg.url, cfg.api_key)
        return self._client


def rejected_key_hint(source: str | None, config: Path | None = None) -> str:
    """Where the key the API refused came from, and what to do about it."""
    if source == "none":
        return f"no API key was given: set {ENV_KEY}, pass --key, or run `torchyard login`"
    if source == "--key":
        return "the key passed with --key was refused"
    if source == ENV_KEY:
        return f"the refused key came from the environment variable {ENV_KEY}; set a valid key there, or unset it to use the config file"
    if source == "typed":
        return "the key typed was refused"
    if source:
        return f"the refused key came from {source}; `torchyard login` replaces it"
    return f"set {ENV_KEY} or api_key in {config or config_path()}"


def _settings(ctx: typer.Context) -> CliContext:
    return ctx.obj  # set by main(); click hands it down to subcommands and the keys group


def _fail(message: str, code: int) -> typer.Exit:
    err.print("[bold red]error:[/]", Text(message), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handles_errors(fn: F) -> F:
    """Turn the client's exceptions into one line on stderr and the documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Unauthorized as exc:
            # Every command takes ``ctx`` (a context of typer's own click, not typer.Context's base).
            find_root = getattr(kwargs.get("ctx"), "find_root", None)
            opts = find_root().obj if find_root else None
            hint = rejected_key_hint(opts.key_source, opts.config) if isinstance(opts, CliContext) else rejected_key_hint(None)
            raise _fail(f"{exc.detail} ({hint})", EXIT_API) from None
        except ApiError as exc:
            raise _fail(exc.detail if exc.status_code < 500 else f"server error {exc.status_code}: {exc.detail}",
                        EXIT_API if exc.status_code < 500 else EXIT_UNREACHABLE) from None
        except ConnectionFailed as exc:
            raise _fail(f"{exc} (is the service up? `torchyard up` runs one locally)", EXIT_UNREACHABLE) from None
        except (ConfigError, TorchyardError) as exc:
            raise _fail(str(exc), EXIT_USAGE) from None

    return wrapper  # type: ignore[return-value]


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _dump(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj.model_dump(mode="json")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"torchyard {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
    url: Annotated[str | None, typer.Option("--url", envvar="TORCHYARD_URL", help="API URL.", show_default=False)] = None,
    key: Annotated[str | None, typer.Option("--key", envvar="TORCHYARD_API_KEY", help="API key.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option("--config", envvar="TORCHYARD_CONFIG", help="Config file (TOML).",
                                                show_default=False)] = None,
) -> None:
    source = ctx.get_parameter_source("key")  # typer's own click: its ParameterSource is compared by name
    key_from = {"COMMANDLINE": "--key", "ENVIRONMENT": ENV_KEY}.get(source.name if source else "")
    ctx.obj = CliContext(url=url, key=key, config=config, key_from=key_from)


# Last, and in this order: each module registers its commands on `app` as it is imported (the helpers above must exist
# by then), and `torchyard --help` lists commands, then groups, in the order they were registered.
# isort: off
from torchyard.cli import jobs, job_output, job_control, files, hosts, usage, tensorboard, connect  # noqa: E402,F401
from torchyard.cli.keys import keys_app  # noqa: E402
from torchyard.cli.quota import quota_app  # noqa: E402
from torchyard.cli.webhooks import webhooks_app  # noqa: E402

app.add_typer(keys_app, name="keys")
app.add_typer(quota_app, name="quota")
app.add_typer(webhooks_app, name="webhooks")
from torchyard.cli import sweep as _sweep  # noqa: E402,F401  (registers `torchyard sweep` and `torchyard sweeps` on the app)
# isort: on
