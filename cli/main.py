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
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
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
from cli.launcher_log import expected_stop, fold_expected_stop
from cli.render import job_panel, jobs_table, metrics_table, status_markup
from client import (
    ApiError,
    Client,
    ConfigError,
    ConnectionFailed,
    Job,
    JobPage,
    NotFound,
    TorchyardError,
    Unauthorized,
    left_out,
    load_config,
    load_spec,
)
from client.config import DEFAULT_URL, ENV_KEY, config_path, read_config_file, write_config_file

try:
    __version__ = importlib.metadata.version("torchyard")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

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
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True, context_settings={"help_option_names": ["-h", "--help"]},
)
keys_app = typer.Typer(help="Manage API keys (needs the admin key).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

F = TypeVar("F", bound=Callable[..., Any])


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


def _follow_and_exit(client: Client, job: Job, as_json: bool = False) -> None:
    try:
        final = client.wait(job.id) if as_json else follow(client, job, console)
    except KeyboardInterrupt:
        err.print(f"\ndetached; job {job.id} keeps running (`torchyard cancel {job.id}` stops it)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        _echo_json(_dump(final))
    else:
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
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", "-w", help="Upload this directory (honouring .gitignore and .torchyardignore) and run the script job's "
                                "entrypoint from it.", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the job id.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the created job as JSON.")] = False,
) -> None:
    """Submit a job spec; with --workdir, your directory's code; with --follow, watch it to the end."""
    spec = load_spec(spec_file)
    if name:
        spec["name"] = name
    if label:
        spec["labels"] = {**(spec.get("labels") or {}), **_parse_pairs(label, "--label")}
    _apply_set(spec, _parse_pairs(set_, "--set"))
    client = _settings(ctx).client()
    if workdir is not None:
        if spec.get("kind") != "script":
            raise _fail("--workdir runs a script job: the spec needs 'kind: script' and an entrypoint inside the directory", EXIT_USAGE)
        for item in left_out.check(workdir, str(spec.get("entrypoint", ""))):
            err.print(f"[yellow]warning:[/] {escape(item.message())}")
        bundle = client.upload_code(workdir)
        spec["code"] = bundle.digest
        if not (quiet or as_json):
            sent = f"uploaded {bundle.size_bytes / 1e6:.1f} MB" if bundle.uploaded else "already on the server"
            err.print(f"code {bundle.digest[:19]}... ({bundle.files} files, {sent})")
    job = client.submit(spec)
    if as_json and not follow_:
        _echo_json(_dump(job))
    elif quiet:
        typer.echo(job.id)
    else:
        where = f" at queue position {job.queue_position}" if job.queue_position is not None else ""
        console.print(f"submitted [bold]{job.id}[/] ({job.name}), {status_markup(job.status)}{where}")
    if follow_:
        _follow_and_exit(client, job, as_json)


@app.command()
@handles_errors
def watch(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="No live view: wait, then print the finished job as JSON.")] = False,
) -> None:
    """Follow a job's progress live to its end; exit 0/1/3 as it succeeds/fails/is cancelled."""
    client = _settings(ctx).client()
    _follow_and_exit(client, client.job(job_id), as_json)


@app.command("ls")
@handles_errors
def list_jobs(
    ctx: typer.Context,
    status: Annotated[list[str], typer.Option("--status", "-s", help="queued, running, ...; repeat.")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="Exact job name.")] = None,
    label: Annotated[list[str], typer.Option("--label", "-l", help="key=value; repeat to require several.")] = [],  # noqa: B006
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500, help="How many, newest first.")] = 20,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Every matching job, fetched --limit at a time.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List jobs, newest first."""
    client = _settings(ctx).client()
    filters: dict[str, Any] = {"status": status or None, "name": name, "labels": _parse_pairs(label, "--label")}
    if all_:
        page = JobPage(items=list(client.iter_jobs(**filters, limit=limit)), next_cursor=None)
    else:
        page = client.list_jobs(**filters, limit=limit)
    if as_json:
        _echo_json({"items": _dump(page.items), "next_cursor": page.next_cursor})
        return
    if not page.items:
        console.print("no jobs")
        return
    console.print(jobs_table(page.items))
    if page.next_cursor:
        console.print(f"[dim]showing the newest {len(page.items)}; --limit or --all for more[/]")


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
    rank: Annotated[str | None, typer.Option(
        "--rank", "-r", help="A global rank (its stdout and stderr as printed), or 'launcher' for torchrun's own log. "
                             "Default: every rank, each line prefixed [rank N].", show_default=False)] = None,
    tail: Annotated[int | None, typer.Option("--tail", "-t", min=1, help="Only the last N lines.")] = None,
    stdout: Annotated[bool, typer.Option("--stdout", help="With --rank: only what the rank wrote to stdout.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="With --rank: only what the rank wrote to stderr.")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="Attempt number; default: the current one.")] = None,
) -> None:
    """Print a job's logs as its ranks printed them: all ranks merged, one with --rank, or torchrun's with --rank launcher."""
    if rank is not None and rank != "launcher" and not rank.isdigit():
        raise _fail(f"--rank {rank!r}: give a rank number or 'launcher'", EXIT_USAGE)
    if (stdout or stderr) and (rank is None or rank == "launcher"):
        raise _fail("--stdout and --stderr need --rank N", EXIT_USAGE)
    client = _settings(ctx).client()
    opts: dict[str, Any] = {"rank": rank, "tail": tail, "attempt": attempt,
                            "stream": "stdout" if stdout else "stderr" if stderr else None}
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
        if rank == "launcher":
            job = client.job(job_id)
            why = expected_stop(job.status, job.error.type if job.error else None, attempt, job.attempt)
            text = fold_expected_stop(text, why) if why else text
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
def cancel(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Cancel a queued or running job (a running one saves a checkpoint and stops)."""
    job = _settings(ctx).client().cancel(job_id)
    if as_json:
        _echo_json(_dump(job))
        return
    console.print(f"{job.id}: {status_markup(job.status)}")


@app.command()
@handles_errors
def retry(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Show live progress to the end.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the new job as JSON (with --follow: once it finished).")] = False,
) -> None:
    """Run a finished job again as a new job, resuming from its latest checkpoint."""
    client = _settings(ctx).client()
    job = client.retry(job_id)
    if as_json and not follow_:
        _echo_json(_dump(job))
    elif not as_json:
        # The service resumes from the old job's latest checkpoint still on disk (jobs.submission.retry).
        saved = [c for c in client.checkpoints(job_id) if c.available]
        start = f"from its checkpoint at step {saved[-1].step}" if saved else "from scratch (it left no checkpoint)"
        console.print(f"retried {job_id} as [bold]{job.id}[/] ({job.name}), {status_markup(job.status)}, {start}")
    if follow_:
        _follow_and_exit(client, job, as_json)


@app.command()
@handles_errors
def download(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    step: Annotated[int | None, typer.Option("--step", min=0, help="That checkpoint's weights; default the latest that has them.",
                                             show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (or directory) to write; default the server's "
                                                                       "file name in the current directory.", show_default=False)] = None,
    checkpoint_path: Annotated[str | None, typer.Option("--path", help="The checkpoint whose listed path ends with this "
                                                        "('last.ckpt', 'checkpoint-500'); a file checkpoint downloads whole.",
                                                        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print where it went as JSON.")] = False,
) -> None:
    """Download a job's consolidated weights (a safetensors file), or a checkpoint its script wrote (a directory as a tar)."""
    client = _settings(ctx).client()
    listed = client.checkpoints(job_id) if checkpoint_path is not None or step is not None else []
    if checkpoint_path is not None:
        step = _checkpoint_step(listed, job_id, checkpoint_path)
    chosen = next((c for c in listed if c.step == step), None)
    if chosen is not None and chosen.weights_url is None and chosen.details.get("found") in ("huggingface", "accelerate", "glob"):
        path = client.download_checkpoint_archive(job_id, chosen.step, output)  # a directory: one tar file
    else:
        path = client.download_weights(job_id, output, step=step)
    if as_json:
        _echo_json({"job_id": job_id, "step": step, "path": str(path), "size_bytes": path.stat().st_size})
        return
    console.print(f"wrote {escape(str(path))} ({path.stat().st_size / 1e6:.1f} MB)")


def _checkpoint_step(checkpoints: list[Any], job_id: str, wanted: str) -> int:
    """The step of the one checkpoint whose path ends with ``wanted`` (whole path components)."""
    tail = Path(wanted.strip("/")).parts
    matches = [c.step for c in checkpoints if tail and Path(c.path).parts[-len(tail):] == tail]
    if len(matches) != 1:
        listed = ", ".join(Path(c.path).name for c in checkpoints[-5:]) or "none"
        raise typer.BadParameter(f"{len(matches)} checkpoints of job {job_id} end with {wanted!r} (latest: {listed})",
                                 param_hint="--path")
    return matches[0]


@app.command()
@handles_errors
def artifacts(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    get: Annotated[str | None, typer.Option("--get", help="Download this file (a path as listed).", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where --get writes; default the file's name in the "
                                                                       "current directory.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the files a job wrote under its artifacts/ directory (TensorBoard events, profiler traces) and, as workdir/PATH,
    in its working directory (framework checkpoints and logs, outputs), or download one."""
    client = _settings(ctx).client()
    if get is not None:
        path = client.download_artifact(job_id, get, output if output is not None else Path(get).name)
        if as_json:
            _echo_json({"job_id": job_id, "artifact": get, "path": str(path), "size_bytes": path.stat().st_size})
        else:
            console.print(f"wrote {escape(str(path))} ({path.stat().st_size} bytes)")
        return
    items = client.artifacts(job_id)
    if as_json:
        _echo_json([_dump(a) for a in items])
        return
    if not items:
        console.print(f"job {escape(job_id)} has no artifacts (yet)")
        return
    for a in items:
        modified = a.modified.strftime("%Y-%m-%d %H:%M:%S") if a.modified else ""
        console.print(f"{a.size_bytes:>12}  {modified}  {escape(a.path)}")


@app.command()
@handles_errors
def hosts(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the workers' hosts: each GPU with the job that holds it, and CPU slots in use."""
    from cli.hosts import hosts_table

    items = _settings(ctx).client().hosts()
    if as_json:
        _echo_json([_dump(h) for h in items])
        return
    if not items:
        console.print("no host has registered; start a worker (python -m worker)")
        return
    console.print(hosts_table(items))


@app.command()
@handles_errors
def tensorboard(
    ctx: typer.Context,
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.", show_default=False)],
    logdir: Annotated[Path | None, typer.Option("--logdir", help="Where the event files go (one subdirectory per job); "
                                                                 "default a new temporary directory.", show_default=False)] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="TensorBoard's port; default its own (6006).",
                                             show_default=False)] = None,
    print_only: Annotated[bool, typer.Option("--print", help="Download, then print the tensorboard command instead of "
                                                             "running it.")] = False,
) -> None:
    """Download the jobs' TensorBoard event files into one logdir and start TensorBoard on it."""
    from cli import tensorboard as tb

    target = logdir if logdir is not None else Path(tempfile.mkdtemp(prefix="torchyard-tb-"))
    written = tb.download(_settings(ctx).client(), job_ids, target)
    for job_id, files in written.items():
        if not files:
            err.print(f"[yellow]job {escape(job_id)} has no TensorBoard event files (yet)[/]")
    cmd = tb.command(target, port)
    if print_only:
        console.print(tb.shell(cmd), markup=False)
        return
    err.print(f"TensorBoard on {escape(str(target))}: {escape(tb.shell(cmd))}")
    raise typer.Exit(subprocess.call(cmd))


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
    queue: Annotated[list[str], typer.Option("--queue", help="A queue the key may submit to; repeat. Default: all.")] = [],  # noqa: B006
    max_priority: Annotated[int, typer.Option(min=0, max=100, help="The highest job priority the key may submit at.")] = 50,
    may_protect: Annotated[bool, typer.Option(help="May submit jobs with preemptible: false.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Create an API key; the secret is printed once."""
    key = _settings(ctx).client().create_key(owner, name, queue or None, max_priority=max_priority, may_protect=may_protect)
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
def keys_revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="Key id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Revoke an API key; requests with it are refused from now on."""
    _settings(ctx).client().revoke_key(key_id)
    if as_json:
        _echo_json({"id": key_id, "revoked": True})
        return
    console.print(f"revoked {key_id}")


# Last: the quota and sweep commands use the helpers above.
from cli.quota import quota_app  # noqa: E402

app.add_typer(quota_app, name="quota")
from cli import sweep as _sweep  # noqa: E402,F401  (registers `torchyard sweep` and `torchyard sweeps` on the app)
