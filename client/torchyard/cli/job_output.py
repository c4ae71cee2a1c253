"""``torchyard logs`` and ``torchyard metrics``: what a job's ranks printed, and what they reported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from torchyard.cli.launcher_log import expected_stop, fold_expected_stop
from torchyard.cli.main import (
    EXIT_API,
    EXIT_INTERRUPTED,
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
from torchyard.cli.render import metrics_table
from torchyard.client import NotFound

DEFAULT_METRICS = ("train/loss", "eval/loss", "eval/accuracy", "train/samples_per_s", "train/tokens_per_s", "train/lr", "train/grad_norm")


@app.command()
@handles_errors
def logs(
    ctx: typer.Context,
    job_id: JobIdArg,
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
    job_id: JobIdArg,
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
        from torchyard.cli.plot import plot_metrics  # matplotlib is slow to import; only pay for it here

        job = client.job(job_id)
        out = plot_metrics(points, plot, f"{job.name} ({job.id}), {job.status}")
        console.print(f"wrote {out}")
        return
    console.print(metrics_table(points, last or None))


