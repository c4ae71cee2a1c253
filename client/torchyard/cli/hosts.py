"""``torchyard hosts``: the workers' hosts as a table, one cell per GPU naming the job that holds it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from torchyard.cli.main import _dump, _echo_json, _settings, app, console, handles_errors
from torchyard.client import Host


def gpu_cells(host: Host) -> Text:
    """``0:free 1:<job id> 2:busy``: busy without an id is another owner's job."""
    text = Text()
    for i, gpu in enumerate(host.gpus):
        if i:
            text.append(" ")
        label = gpu.job_id or ("busy" if gpu.busy else "quarantined" if gpu.state == "quarantined" else "free")
        text.append(f"{gpu.index}:", style="dim")
        text.append(label, style="green" if not gpu.busy else "yellow" if gpu.job_id else "red")
    return text if host.gpus else Text("-", style="dim")


def hosts_table(hosts: list[Host]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "STATE", "ALIVE", "GPUS FREE", "CPU SLOTS", "LAST SEEN", "GPUS"):
        table.add_column(col)
    for h in hosts:
        free = sum(1 for g in h.gpus if not g.busy and g.state == "ready")
        state = Text(h.state + (f" ({h.reason})" if h.reason else ""), style="" if h.state == "ready" else "yellow")
        table.add_row(h.id, state, "yes" if h.alive else Text("no", style="red"), f"{free}/{len(h.gpus)}",
                      f"{h.cpu_slots.used}/{h.cpu_slots.total} used", f"{h.last_seen:%Y-%m-%d %H:%M:%S}" if h.last_seen else "-",
                      gpu_cells(h))
    return table


hosts_app = typer.Typer(help="List the workers' hosts; drain, undrain, clear a quarantined GPU (admin).",
                        invoke_without_command=True, no_args_is_help=False)
app.add_typer(hosts_app, name="hosts")


@hosts_app.callback()
@handles_errors
def hosts(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the workers' hosts: each with its state, each GPU with the job that holds it, and CPU slots in use."""
    if ctx.invoked_subcommand is not None:
        return
    items = _settings(ctx).client().hosts()
    if as_json:
        _echo_json([_dump(h) for h in items])
        return
    if not items:
        console.print("no host has registered; start a worker (python -m worker)")
        return
    console.print(hosts_table(items))


def _said(host: Host) -> None:
    console.print(f"host {host.id}: {host.state}" + (f" ({host.reason})" if host.reason else ""))


@hosts_app.command("drain")
@handles_errors
def drain(ctx: typer.Context, host: Annotated[str, typer.Argument(help="The host id (torchyard hosts).")],
          reason: Annotated[str, typer.Option("--reason", help="Why, as waiting jobs and the history show it.")]
          = "drained by the admin") -> None:
    """Drain a host (admin): nothing new is placed there; its running jobs checkpoint and are placed elsewhere."""
    _said(_settings(ctx).client().drain_host(host, reason))


@hosts_app.command("undrain")
@handles_errors
def undrain(ctx: typer.Context, host: Annotated[str, typer.Argument(help="The host id.")]) -> None:
    """Return a drained host to placement (admin)."""
    _said(_settings(ctx).client().undrain_host(host))


@hosts_app.command("clear")
@handles_errors
def clear(ctx: typer.Context, host: Annotated[str, typer.Argument(help="The host id.")],
          gpu: Annotated[int, typer.Argument(help="The GPU's index on the host.")]) -> None:
    """Return a quarantined GPU to placement (admin)."""
    found = _settings(ctx).client().clear_gpu(host, gpu)
    state = next((g.state for g in found.gpus if g.index == gpu), "ready")
    console.print(f"host {found.id} GPU {gpu}: {state}")
