"""``torchyard submit``, ``watch``, ``ls`` and ``status``: submit a spec (with --workdir, a directory's code), follow a job
to its end, list jobs, show one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape

from torchyard.cli.follow import follow
from torchyard.cli.main import (
    EXIT_INTERRUPTED,
    EXIT_JOB_CANCELLED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JobIdArg,
    _dump,
    _echo_json,
    _fail,
    _settings,
    app,
    console,
    err,
    handles_errors,
)
from torchyard.cli.render import job_panel, jobs_table, status_markup
from torchyard.client import Client, Job, JobPage, left_out, load_spec

_JOB_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_CANCELLED}


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
    after: Annotated[list[str], typer.Option("--after", help="A job id that must succeed first (depends_on); repeat.",
                                             show_default=False)] = [],  # noqa: B006
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the job id.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the created job as JSON.")] = False,
) -> None:
    """Submit a job spec; with --workdir, your directory's code; with --after, once other jobs succeeded; with --follow,
    watch it to the end."""
    spec = load_spec(spec_file)
    if name:
        spec["name"] = name
    if label:
        spec["labels"] = {**(spec.get("labels") or {}), **_parse_pairs(label, "--label")}
    _apply_set(spec, _parse_pairs(set_, "--set"))
    if after:
        spec["depends_on"] = [*(spec.get("depends_on") or []), *after]
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
    job_id: JobIdArg,
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
    owner: Annotated[str | None, typer.Option("--owner", "-o", help="(admin) This owner's jobs, or '*' for every owner's.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List jobs, newest first: yours, or (admin) another owner's or everyone's with --owner."""
    client = _settings(ctx).client()
    filters: dict[str, Any] = {"status": status or None, "name": name, "labels": _parse_pairs(label, "--label"), "owner": owner}
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
    console.print(jobs_table(page.items, owners=owner is not None))
    if page.next_cursor:
        console.print(f"[dim]showing the newest {len(page.items)}; --limit or --all for more[/]")


@app.command()
@handles_errors
def status(
    ctx: typer.Context,
    job_id: JobIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Show one job: status, progress, latest metrics, checkpoints and error."""
    client = _settings(ctx).client()
    job = client.job(job_id)
    if as_json:
        _echo_json(_dump(job))
        return
    console.print(job_panel(job, client.checkpoints(job_id)))


