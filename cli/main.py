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
import yaml
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from cli.follow import follow
from cli.render import job_panel, jobs_table, metrics_table, status_markup
from client import (
    ApiError,
    Client,
    ConfigError,
    ConnectionFailed,
    Job,
    NotFound,
    TorchyardError,
    Unauthorized,
    load_config,
    load_spec,
)
from client.config import config_path

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_JOB_CANCELLED, EXIT_API, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 5, 130
DEFAULT_METRICS = ("train/loss", "eval/loss", "eval/accuracy", "train/samples_per_s", "train/tokens_per_s", "train/lr", "train/grad_norm")
_JOB_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_CANCELLED}

# Piped or captured output (scripts, CI logs) gets wide lines instead of Rich's 80-column default,
# so tables of 24-character job ids do not fold.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(highlight=False, width=_WIDTH)
err = Console(stderr=True, highlight=False, width=_WIDTH)

app = typer.Typer(
    name="torchyard", help="Submit, watch and manage PyTorch training jobs on a torchyard service.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, context_settings={"help_option_names": ["-h", "--help"]},
)
keys_app = typer.Typer(help="Manage API keys (needs the admin key).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    url: str | None
    key: str | None
    config: Path | None
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            cfg = load_config(self.url, self.key, self.config)
            self._client = Client(cfg.url, cfg.api_key)
        return self._client


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
            hint = f"set TORCHYARD_API_KEY or api_key in {config_path()}"
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


def _follow_and_exit(client: Client, job: Job) -> None:
    try:
        final = follow(client, job, console)
    except KeyboardInterrupt:
        err.print(f"\ndetached; job {job.id} keeps running (`torchyard cancel {job.id}` stops it)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    console.print(job_panel(final))
    raise typer.Exit(_JOB_EXIT.get(final.status, EXIT_JOB_FAILED))


def _parse_pairs(items: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"{what} {item!r} must be key=value", EXIT_USAGE)
        pairs[key] = value
    return pairs


def _apply_set(spec: dict[str, Any], assignments: dict[str, str]) -> None:
    """``--set train.lr=0.01``: the value is read as YAML, so numbers, booleans and lists keep their type."""
    for path, raw in assignments.items():
        node = spec
        *parents, leaf = path.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _fail(f"--set {path}: {part} is not a mapping in the spec", EXIT_USAGE)
            node = child
        node[leaf] = yaml.safe_load(raw)


# ---------------------------------------------------------------------------------------------- commands


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", envvar="TORCHYARD_URL", help="API URL.", show_default=False)] = None,
    key: Annotated[str | None, typer.Option("--key", envvar="TORCHYARD_API_KEY", help="API key.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option("--config", envvar="TORCHYARD_CONFIG", help="Config file (TOML).",
                                                show_default=False)] = None,
) -> None:
    ctx.obj = CliContext(url=url, key=key, config=config)


@app.command()
@handles_errors
def submit(
    ctx: typer.Context,
    spec_file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.", show_default=False)],
    follow_: Annotated[bool, typer.Option("--follow", "-f",
                                          help="Show live progress; exit 0/1/3 as the job succeeds/fails/is cancelled.")] = False,
    name: Annotated[str | None, typer.Option(help="Override the spec's name.")] = None,
    label: Annotated[list[str], typer.Option("--label", "-l", help="key=value; repeat.")] = [],  # noqa: B006
    set_: Annotated[list[str], typer.Option("--set", help="Override a spec field, e.g. train.lr=0.01; repeat.")] = [],  # noqa: B006
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the job id.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the created job as JSON.")] = False,
) -> None:
    """Submit a job spec; with --follow, watch it to the end."""
    spec = load_spec(spec_file)
    if name:
        spec["name"] = name
    if label:
        spec["labels"] = {**(spec.get("labels") or {}), **_parse_pairs(label, "--label")}
    _apply_set(spec, _parse_pairs(set_, "--set"))
    client = _settings(ctx).client()
    job = client.submit(spec)
    if as_json:
        _echo_json(_dump(job))
    elif quiet:
        typer.echo(job.id)
    else:
        where = f" at queue position {job.queue_position}" if job.queue_position is not None else ""
        console.print(f"submitted [bold]{job.id}[/] ({job.name}), {status_markup(job.status)}{where}")
    if follow_:
        _follow_and_exit(client, job)


@app.command()
@handles_errors
def watch(ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)]) -> None:
    """Follow a job's progress live to its end; exit 0/1/3 as it succeeds/fails/is cancelled."""
    client = _settings(ctx).client()
    _follow_and_exit(client, client.job(job_id))


@app.command("ls")
@handles_errors
def list_jobs(
    ctx: typer.Context,
    status: Annotated[list[str], typer.Option("--status", "-s", help="queued, running, ...; repeat.")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="Exact job name.")] = None,
    label: Annotated[list[str], typer.Option("--label", "-l", help="key=value; repeat to require several.")] = [],  # noqa: B006
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500, help="How many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List jobs, newest first."""
    page = _settings(ctx).client().list_jobs(status=status or None, name=name, labels=_parse_pairs(label, "--label"), limit=limit)
    if as_json:
        _echo_json({"items": _dump(page.items), "next_cursor": page.next_cursor})
        return
    if not page.items:
        console.print("no jobs")
        return
    console.print(jobs_table(page.items))
    if page.next_cursor:
        console.print(f"[dim]showing the newest {len(page.items)}; use --limit for more[/]")


@app.command()
@handles_errors
def status(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Show one job: status, progress, latest metrics, checkpoints and error."""
    client = _settings(ctx).client()
    job = client.job(job_id)
    if as_json:
        _echo_json(_dump(job))
        return
    console.print(job_panel(job, client.checkpoints(job_id)))


@app.command()
@handles_errors
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    rank: Annotated[int | None, typer.Option("--rank", "-r", min=0, help="Global rank; default: torchrun's launcher log.")] = None,
    tail: Annotated[int | None, typer.Option("--tail", "-t", min=1, help="Only the last N lines.")] = None,
    stdout: Annotated[bool, typer.Option("--stdout", help="The rank's stdout instead of its stderr (where the trainer logs).")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="Attempt number; default: the current one.")] = None,
) -> None:
    """Print a job's logs: torchrun's launcher log, or one rank's with --rank."""
    client = _settings(ctx).client()
    opts: dict[str, Any] = {"rank": rank, "tail": tail, "attempt": attempt, "stream": "stdout" if stdout else None}
    try:
        if follow_:
            try:
                for chunk in client.follow_logs(job_id, **opts):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                raise typer.Exit(EXIT_INTERRUPTED) from None
            return
        text = client.logs(job_id, **opts)
    except NotFound as exc:
        job = client.job(job_id)  # raises NotFound itself when the job is what is missing
        # The job exists: this server has no logs endpoint, or no log for that rank yet.
        if job.error and job.error.log_tail:
            err.print(f"[yellow]no logs from the server ({escape(exc.detail)}); the failing rank's log tail follows[/]")
            typer.echo(job.error.log_tail)
            return
        raise _fail(f"no logs for job {job_id}: {exc.detail}", EXIT_API) from None
    typer.echo(text, nl=not text.endswith("\n"))


@app.command()
@handles_errors
def metrics(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    name: Annotated[list[str], typer.Option("--name", "-m",
                                            help="Metric name, e.g. train/loss; repeat. Default: loss, accuracy, throughput.")] = [],  # noqa: B006
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG chart of the metrics here.", show_default=False)] = None,
    last: Annotated[int, typer.Option("--last", help="Rows (steps) to show in the table; 0 for all.", min=0)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the points as JSON.")] = False,
) -> None:
    """Show a job's metrics as a table by step, or plot them to a PNG."""
    client = _settings(ctx).client()
    points = client.metrics(job_id, name or None)
    if not name and not as_json:
        # Without --name, the metrics people look at first; memory and timing counters stay in --json.
        chosen = [p for p in points if p.name in DEFAULT_METRICS]
        points = chosen or points
    if as_json:
        _echo_json(_dump(points))
        return
    if not points:
        console.print("no metrics yet")
        if plot:
            raise typer.Exit(EXIT_API)
        return
    if plot:
        from cli.plot import plot_metrics  # matplotlib is slow to import; only pay for it here

        job = client.job(job_id)
        out = plot_metrics(points, plot, f"{job.name} ({job.id}), {job.status}")
        console.print(f"wrote {out}")
        return
    console.print(metrics_table(points, last or None))


@app.command()
@handles_errors
def cancel(ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)]) -> None:
    """Cancel a queued or running job (a running one saves a checkpoint and stops)."""
    job = _settings(ctx).client().cancel(job_id)
    console.print(f"{job.id}: {status_markup(job.status)}")


@app.command()
@handles_errors
def retry(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Show live progress to the end.")] = False,
) -> None:
    """Run a finished job again as a new job, resuming from its latest checkpoint."""
    client = _settings(ctx).client()
    job = client.retry(job_id)
    console.print(f"retried {job_id} as [bold]{job.id}[/] ({job.name}), {status_markup(job.status)}")
    if follow_:
        _follow_and_exit(client, job)


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Interface the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes (one job each at a time).")] = 1,
) -> None:
    """Run the whole service locally: API, worker(s) and a private Redis if none answers (python -m stack)."""
    argv = [sys.executable, "-m", "stack", "--host", host, "--port", str(port), "--workers", str(workers)]
    url = f"http://{host}:{port}"
    console.print(f"dashboard: [bold]{url}/[/] (sign in with the admin token below)\n"
                  f"CLI:       export TORCHYARD_URL={url} TORCHYARD_API_KEY=<the admin token>")
    sys.stdout.flush()
    # exec, not a child: Ctrl-C and SIGTERM reach the stack runner, which stops its own children.
    os.execv(sys.executable, argv)


@keys_app.command("create")
@handles_errors
def keys_create(
    ctx: typer.Context,
    owner: Annotated[str, typer.Option(help="Owner of the jobs submitted with this key.", show_default=False)],
    name: Annotated[str, typer.Option(help="What the key is for, e.g. 'ci' or 'alice-laptop'.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create an API key; the secret is printed once."""
    key = _settings(ctx).client().create_key(owner, name)
    if as_json:
        _echo_json(_dump(key))
        return
    console.print(f"key [bold]{key.id}[/] for owner {key.owner} ({key.name}); the secret is shown only now:")
    typer.echo(key.key)


@keys_app.command("ls")
@handles_errors
def keys_list(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List API keys (never their secrets)."""
    keys = _settings(ctx).client().list_keys()
    if as_json:
        _echo_json(_dump(keys))
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "OWNER", "NAME", "CREATED", "REVOKED"):
        table.add_column(col)
    for k in keys:
        table.add_row(k.id, k.owner, k.name or "", f"{k.created_at:%Y-%m-%d %H:%M}" if k.created_at else "",
                      f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "")
    console.print(table)


@keys_app.command("revoke")
@handles_errors
def keys_revoke(ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="Key id.", show_default=False)]) -> None:
    """Revoke an API key; requests with it are refused from now on."""
    _settings(ctx).client().revoke_key(key_id)
    console.print(f"revoked {key_id}")
