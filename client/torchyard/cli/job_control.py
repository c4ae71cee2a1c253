"""``torchyard cancel``, ``retry``, ``priority`` and ``rm``: stop a job, run a finished one again from its latest
checkpoint, move a waiting or running one up or down, or delete finished jobs."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from torchyard.cli.jobs import _follow_and_exit, _parse_pairs
from torchyard.cli.main import EXIT_API, EXIT_USAGE, JobIdArg, _dump, _echo_json, _fail, _settings, app, console, err, handles_errors
from torchyard.cli.render import status_markup
from torchyard.client import ApiError, Client
from torchyard.client.models import TERMINAL


@app.command()
@handles_errors
def cancel(
    ctx: typer.Context,
    job_id: JobIdArg,
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
    job_id: JobIdArg,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Show live progress to the end.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the new job as JSON (with --follow: once it finished).")] = False,
) -> None:
    """Run a finished job again as a new job, resuming from its latest checkpoint."""
    client = _settings(ctx).client()
    job = client.retry(job_id)
    if as_json and not follow_:
        _echo_json(_dump(job))
    elif not as_json:
        # The service resumes from the old job's latest checkpoint still on disk (jobs.lifecycle.submission.retry).
        saved = [c for c in client.checkpoints(job_id) if c.available]
        start = f"from its checkpoint at step {saved[-1].step}" if saved else "from scratch (it left no checkpoint)"
        console.print(f"retried {job_id} as [bold]{job.id}[/] ({job.name}), {status_markup(job.status)}, {start}")
    if follow_:
        _follow_and_exit(client, job, as_json)


@app.command()
@handles_errors
def priority(
    ctx: typer.Context,
    job_id: JobIdArg,
    value: Annotated[int, typer.Argument(min=0, max=100, help="0-100, at most your key's max_priority.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Change a queued or running job's priority: higher goes first and may preempt lower-priority jobs."""
    client = _settings(ctx).client()
    before = client.job(job_id).priority
    job = client.set_priority(job_id, value)
    if as_json:
        _echo_json(_dump(job))
        return
    # The scheduler's next pass (nudged by the change) moves it in line or preempts; `torchyard status` shows where.
    console.print(f"{job.id}: priority {before} -> {job.priority}, {status_markup(job.status)}")


@app.command("rm")
@handles_errors
def remove(
    ctx: typer.Context,
    job_ids: Annotated[list[str] | None, typer.Argument(help="Job ids.", show_default=False)] = None,
    status: Annotated[list[str], typer.Option("--status", "-s", help="Instead of ids: every job in this finished status "
                                               "(succeeded, failed, cancelled); repeat.")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="Instead of ids: the finished jobs of this exact name.")] = None,
    label: Annotated[list[str], typer.Option("--label", "-l", help="Instead of ids: finished jobs with key=value; repeat.")] = [],  # noqa: B006
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete the jobs --status, --name or --label chose without asking.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was deleted and what was refused as JSON.")] = False,
) -> None:
    """Delete finished jobs with their metrics, checkpoints, logs and run directories (a queued or running job: cancel
    it first). Exits 4 when any job could not be deleted; the others are deleted."""
    if job_ids and (status or name or label):
        raise _fail("give job ids, or choose jobs with --status, --name or --label; not both", EXIT_USAGE)
    client = _settings(ctx).client()
    if job_ids:
        chosen = list(dict.fromkeys(job_ids))
    elif status or name or label:
        chosen = _choose(client, status, name, label, yes)
    else:
        raise _fail("name the jobs to delete: job ids, or --status succeeded|failed|cancelled", EXIT_USAGE)
    deleted, refused = [], []
    for job_id in chosen:
        try:
            client.delete_job(job_id)
        except ApiError as exc:
            if exc.status_code >= 500:
                raise
            refused.append({"id": job_id, "status_code": exc.status_code, "detail": exc.detail})
            if not as_json:
                err.print(f"[bold red]error:[/] {escape(job_id)}: {escape(exc.detail)}", soft_wrap=True)
            continue
        deleted.append(job_id)
        if not as_json:
            console.print(f"deleted {escape(job_id)}")
    if as_json:
        _echo_json({"deleted": deleted, "refused": refused})
    elif not chosen:
        console.print("no finished jobs match")
    if refused:
        raise typer.Exit(EXIT_API)


def _choose(client: Client, status: list[str], name: str | None, label: list[str], yes: bool) -> list[str]:
    """The finished jobs the filters match, once the user agreed to delete them all."""
    if unfinished := [s for s in status if s not in TERMINAL]:
        raise _fail(f"--status {unfinished[0]}: only finished jobs can be deleted ({', '.join(sorted(TERMINAL))})", EXIT_USAGE)
    labels = _parse_pairs(label, "--label")
    jobs = [j for j in client.iter_jobs(status=status or sorted(TERMINAL), name=name, labels=labels, limit=500) if j.terminal]
    if jobs and not yes:
        what = f"{len(jobs)} finished job{'s' if len(jobs) != 1 else ''} with their metrics, checkpoints and run directories"
        if not sys.stdin.isatty():
            raise _fail(f"this would delete {what}; pass --yes to do it without a prompt", EXIT_USAGE)
        if not typer.confirm(f"Delete {what}?", default=False):
            raise typer.Exit(EXIT_USAGE)
    return [j.id for j in jobs]
