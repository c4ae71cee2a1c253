"""``torchyard hosts``: the workers' hosts as a table, one cell per GPU naming the job that holds it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from cli.main import _dump, _echo_json, _settings, app, console, handles_errors
from client import Host


def gpu_cells(host: Host) -> Text:
    """``0:free 1:<job id> 2:busy``: busy without an id is another owner's job."""
    text = Text()
    for i, gpu in enumerate(host.gpus):
        if i:
            text.append(" ")
        label = gpu.job_id or ("busy" if gpu.busy else "free")
        text.append(f"{gpu.index}:", style="dim")
        text.append(label, style="green" if not gpu.busy else "yellow" if gpu.job_id else "red")
    return text if host.gpus else Text("-", style="dim")


def hosts_table(hosts: list[Host]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "ALIVE", "GPUS FREE", "CPU SLOTS", "LAST SEEN", "GPUS"):
        table.add_column(col)
    for h in hosts:
        free = sum(1 for g in h.gpus if not g.busy)
        table.add_row(h.id, "yes" if h.alive else Text("no", style="red"), f"{free}/{len(h.gpus)}",
                      f"{h.cpu_slots.used}/{h.cpu_slots.total} used", f"{h.last_seen:%Y-%m-%d %H:%M:%S}" if h.last_seen else "-",
                      gpu_cells(h))
    return table


@app.command()
@handles_errors
def hosts(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the workers' hosts: each GPU with the job that holds it, and CPU slots in use."""
    items = _settings(ctx).client().hosts()
    if as_json:
        _echo_json([_dump(h) for h in items])
        return
    if not items:
        console.print("no host has registered; start a worker (python -m worker)")
        return
    console.print(hosts_table(items))
