"""``torchyard quota``: each owner's guaranteed GPUs and CPU slots and what it holds now; the admin sets them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from torchyard.cli.main import _dump, _echo_json, _settings, console, handles_errors
from torchyard.client import Quota

quota_app = typer.Typer(help="Owners' quotas: guaranteed GPUs and CPU slots, and what each holds now.")


def _limit(value: int | None) -> str:
    return "no limit" if value is None else str(value)


def quota_table(items: list[Quota]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("OWNER", "GPUS USED", "GPU QUOTA", "BORROWED", "CPU SLOTS USED", "CPU QUOTA"):
        table.add_column(col, justify="left" if col == "OWNER" else "right")
    for q in items:
        table.add_row(q.owner, str(q.gpus_used), _limit(q.gpus), str(q.gpus_borrowed), str(q.cpu_slots_used), _limit(q.cpu_slots))
    return table


@quota_app.callback(invoke_without_command=True)
@handles_errors
def show(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List quotas and use: every owner's for the admin, your own otherwise."""
    if ctx.invoked_subcommand is not None:
        return
    items = _settings(ctx).client().quotas()
    if as_json:
        _echo_json([_dump(q) for q in items])
        return
    if not items:
        console.print("no quotas set and nothing running: every owner may use every idle GPU")
        return
    console.print(quota_table(items))


@quota_app.command("set")
@handles_errors
def set_quota(
    ctx: typer.Context,
    owner: Annotated[str, typer.Argument(help="The owner (tenant).", show_default=False)],
    gpus: Annotated[int | None, typer.Option(min=0, help="Guaranteed GPUs; omitted: no limit.", show_default=False)] = None,
    cpu_slots: Annotated[int | None, typer.Option(min=0, help="Guaranteed CPU slots; omitted: no limit.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Set an owner's quota (admin). Beyond it the owner borrows idle devices, which an owner within its quota takes back."""
    q = _settings(ctx).client().set_quota(owner, gpus, cpu_slots)
    if as_json:
        _echo_json(_dump(q))
        return
    console.print(f"owner {q.owner}: {_limit(q.gpus)} GPUs, {_limit(q.cpu_slots)} CPU slots guaranteed")


@quota_app.command("rm")
@handles_errors
def remove_quota(ctx: typer.Context, owner: Annotated[str, typer.Argument(help="The owner (tenant).", show_default=False)]) -> None:
    """Remove an owner's quota (admin): no limit, and nothing guaranteed."""
    _settings(ctx).client().delete_quota(owner)
    console.print(f"owner {owner}: quota removed")
