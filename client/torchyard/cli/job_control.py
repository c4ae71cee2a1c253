"""``torchyard cancel`` and ``torchyard retry``: stop a job, or run a finished one again from its latest checkpoint."""

from __future__ import annotations

from typing import Annotated

import typer

from torchyard.cli.jobs import _follow_and_exit
from torchyard.cli.main import JobIdArg, _dump, _echo_json, _settings, app, console, handles_errors
from torchyard.cli.render import status_markup


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


