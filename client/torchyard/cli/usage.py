"""``torchyard usage``: GPU-hours and CPU-slot-hours per owner and/or day, as the API reads them from the attempts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated

import typer
from rich.table import Table

from torchyard.cli.main import _dump, _echo_json, _settings, app, console, handles_errors
from torchyard.client import UsageRow

_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def since_to_start(text: str, now: datetime | None = None) -> datetime:
    """``7d``, ``12h``, ``30m``, ``2w`` before now, or an ISO date or time (UTC unless it says otherwise)."""
    found = re.fullmatch(r"\s*(\d+)\s*([mhdw])\s*", text)
    if found:
        return (now or datetime.now(timezone.utc)) - timedelta(**{_UNITS[found[2]]: int(found[1])})
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a span like 7d, 12h, 30m or 2w nor an ISO date or time",
                                 param_hint="--since") from None
    return start if start.tzinfo else start.replace(tzinfo=timezone.utc)


def usage_table(items: list[UsageRow], by: str) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    keys = [k for k in by.split(",") if k]
    for col in [k.upper() for k in keys] + ["GPU-HOURS", "CPU-SLOT-HOURS", "JOBS", "ATTEMPTS", "PREEMPTED GPU-HOURS"]:
        table.add_column(col, justify="left" if col in ("OWNER", "DAY") else "right")
    for r in items:
        table.add_row(*[str(getattr(r, k) or "-") for k in keys], f"{r.gpu_hours:.2f}", f"{r.cpu_slot_hours:.2f}", str(r.jobs),
                      str(r.attempts), f"{r.preempted_gpu_hours:.2f}")
    return table


@app.command()
@handles_errors
def usage(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option(help="Only since then: 7d, 12h, 30m, 2w, or an ISO date; all time by default.",
                                              show_default=False)] = None,
    by: Annotated[str, typer.Option(help="Group by owner, day, or owner,day.")] = "owner",
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """GPU-hours and CPU-slot-hours from the attempts' placements and times: every owner's for the admin, yours otherwise."""
    start = since_to_start(since) if since else None
    client = _settings(ctx).client()
    if as_csv:
        typer.echo(client.usage_csv(start, group_by=by), nl=False)
        return
    items = client.usage(start, group_by=by)
    if as_json:
        _echo_json([_dump(r) for r in items])
        return
    if not items:
        console.print("no attempt held a GPU or CPU slot in that time")
        return
    console.print(usage_table(items, by))
