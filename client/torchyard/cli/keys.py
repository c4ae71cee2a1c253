"""``torchyard keys create|ls|revoke``: the admin's API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from torchyard.cli.main import _dump, _echo_json, _settings, console, handles_errors

keys_app = typer.Typer(help="Manage API keys (needs the admin key).", no_args_is_help=True)


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

