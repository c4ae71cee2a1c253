"""``torchyard webhooks create|ls|rm|deliveries``: the key's subscriptions to job and sweep events."""

from __future__ import annotations

from typing import Annotated

import typer

from torchyard.cli.main import _echo_json, _settings, console, handles_errors

webhooks_app = typer.Typer(help="Post job and sweep events to a URL (signed; see docs/api.md).", no_args_is_help=True)
EVENTS = "job.started, job.succeeded, job.failed, job.cancelled, job.preempted, sweep.finished, host.drained, gpu.quarantined"


def _events(values: list[str]) -> list[str]:
    return [e.strip() for v in values for e in v.split(",") if e.strip()]


@webhooks_app.command("create")
@handles_errors
def webhooks_create(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="http(s):// address to POST events to.", show_default=False)],
    events: Annotated[list[str], typer.Option("--events", help=f"Event types, comma-separated or repeated: {EVENTS}.",
                                              show_default=False)],
    fmt: Annotated[str, typer.Option("--format", help="json (signed event objects) or slack ({\"text\": one line}).")] = "json",
    secret: Annotated[str | None, typer.Option(help="Signing secret (16+ characters); generated when omitted.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Subscribe URL to events; the signing secret is printed once."""
    hook = _settings(ctx).client().create_webhook(url, _events(events), format=fmt, secret=secret)
    if as_json:
        _echo_json(hook)
        return
    console.print(f"webhook [bold]{hook['id']}[/] posts {', '.join(hook['events'])} to {hook['url']} ({hook['format']}); "
                  "the signing secret is shown only now:")
    typer.echo(hook["secret"])


@webhooks_app.command("ls")
@handles_errors
def webhooks_list(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List webhooks (never their secrets); the admin sees every owner's."""
    hooks = _settings(ctx).client().list_webhooks()
    if as_json:
        _echo_json(hooks)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "OWNER", "FORMAT", "EVENTS", "URL"):
        table.add_column(col)
    for h in hooks:
        table.add_row(h["id"], h["owner"], h["format"], ",".join(h["events"]), h["url"])
    console.print(table)


WebhookIdArg = Annotated[str, typer.Argument(help="Webhook id.", show_default=False)]

@webhooks_app.command("rm")
@handles_errors
def webhooks_remove(
    ctx: typer.Context,
    webhook_id: WebhookIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove a webhook; nothing more is posted for it."""
    _settings(ctx).client().delete_webhook(webhook_id)
    if as_json:
        _echo_json({"id": webhook_id, "removed": True})
        return
    console.print(f"removed {webhook_id}")


@webhooks_app.command("deliveries")
@handles_errors
def webhooks_deliveries(
    ctx: typer.Context,
    webhook_id: WebhookIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The webhook's latest deliveries, newest first: event, status, tries, last HTTP status and error."""
    items = _settings(ctx).client().webhook_deliveries(webhook_id)
    if as_json:
        _echo_json(items)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("DELIVERY", "EVENT", "STATUS", "TRIES", "HTTP", "ERROR"):
        table.add_column(col)
    for d in items:
        table.add_row(d["id"], d["event"], d["status"], str(d["tries"]), str(d["last_status"] or ""), d["error"] or "")
    console.print(table)
