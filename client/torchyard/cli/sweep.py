"""``torchyard sweep SPEC`` (start a sweep, --follow its trials) and ``torchyard sweeps`` (list, show, cancel)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from torchyard.cli.main import (
    EXIT_INTERRUPTED,
    EXIT_JOB_CANCELLED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    _echo_json,
    _settings,
    app,
    console,
    err,
    handles_errors,
)
from torchyard.client import Client, TorchyardError, load_spec

sweeps_app = typer.Typer(help="List, show and cancel sweeps.", invoke_without_command=True)
app.add_typer(sweeps_app, name="sweeps")
_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_CANCELLED}


def load_sweep(path: Path) -> dict[str, Any]:
    """A sweep file; its ``spec`` may be the path of a job spec file, relative to the sweep file."""
    sweep = load_spec(path)
    if isinstance(sweep.get("spec"), str):
        sweep["spec"] = load_spec(path.parent / sweep["spec"])
    if not isinstance(sweep.get("spec"), dict):
        raise TorchyardError(f"{path}: 'spec' must be a job spec (a mapping, or the path of a spec file)")
    return sweep


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _value(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def trials_table(sweep: dict[str, Any]) -> Table:
    trials = sweep.get("trials") or []
    # Asynchronous Hyperband: a trial is ranked only within its bracket, so the column says against whom.
    brackets = len({t.get("bracket") for t in trials}) > 1
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TRIAL", "STATE", *(("BRACKET",) if brackets else ()), "RUNG", "STEP", sweep["metric"].upper(), "BEST",
                "JOB", "PARAMS"):
        table.add_column(col)
    for t in trials:
        star = " *" if t["number"] == sweep.get("best_trial") else ""
        style = "dim" if t["state"] in ("stopped", "cancelled", "failed") else None
        table.add_row(f"{t['number']}{star}", t["state"], *((str(t["bracket"]),) if brackets else ()),
                      "" if t["rung"] is None else str(t["rung"]), "" if t["last_step"] is None else str(t["last_step"]),
                      _value(t["last_value"]), _value(t["best_value"]), t["job_id"] or "", _params(t["params"]), style=style)
    return table


def _change(t: dict[str, Any], metric: str) -> str:
    at_rung = t["rung"] is not None and t["state"] in ("paused", "stopped")
    where = f" at rung {t['rung']}" if at_rung else ""
    # At a rung, the value ASHA ranked the trial by there, not whatever the trial reported last.
    shown = (t.get("rung_values") or {}).get(str(t["rung"])) if at_rung else None
    shown = t["last_value"] if shown is None else shown
    value = f", {metric} {_value(shown)}" if shown is not None else ""
    step = f" (step {t['last_step']})" if t["last_step"] is not None else ""
    verb = {"running": "running", "paused": "paused", "stopped": "stopped early", "succeeded": "finished",
            "failed": "failed", "cancelled": "cancelled", "pending": "waiting for a slot"}.get(t["state"], t["state"])
    return f"trial {t['number']} [{_params(t['params'])}]: {verb}{where}{step}{value}"


def follow_sweep(client: Client, sweep_id: str, poll_s: float = 2.0) -> dict[str, Any]:
    """Print each trial as it starts, reports, is promoted or stopped; return the finished sweep."""
    seen: dict[int, tuple[Any, ...]] = {}
    while True:
        sweep = client.sweep(sweep_id)
        for t in sweep["trials"]:
            now = (t["state"], t["allowed_rung"], t["rung"])
            if seen.get(t["number"]) != now:
                promoted = seen.get(t["number"]) is not None and t["allowed_rung"] > seen[t["number"]][1]
                console.print(escape(f"trial {t['number']} promoted to rung {t['allowed_rung']}" if promoted
                                     else _change(t, sweep["metric"])))
                seen[t["number"]] = now
        if sweep["status"] != "running":
            return sweep
        time.sleep(poll_s)


def _finish(sweep: dict[str, Any]) -> None:
    console.print(trials_table(sweep))
    if sweep.get("best_trial") is not None:
        console.print(f"sweep {sweep['id']} {sweep['status']}: best trial {sweep['best_trial']}, {sweep['metric']} "
                      f"{_value(sweep['best_value'])} ({sweep['mode']})")
        console.print(f"best parameters: [bold]{escape(_params(sweep.get('best_params') or {}))}[/]")
    else:
        console.print(f"sweep {sweep['id']} {sweep['status']}: no trial reported {sweep['metric']}")


@app.command()
@handles_errors
def sweep(
    ctx: typer.Context,
    sweep_file: Annotated[Path, typer.Argument(help="Sweep spec, YAML or JSON (docs/sweeps.md).", show_default=False)],
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Show trials as they go; print the best parameters at "
                                                                 "the end; exit 0/1/3 as the sweep succeeds/fails/is cancelled.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the sweep as JSON.")] = False,
) -> None:
    """Start a hyperparameter sweep: trials of a base spec over a search space (grid, random or ASHA)."""
    client = _settings(ctx).client()
    created = client.create_sweep(load_sweep(sweep_file))
    if as_json and not follow_:
        _echo_json(created)
        return
    if not as_json:
        console.print(f"sweep [bold]{created['id']}[/] ({created['name']}): {created['method']}, "
                      f"{created['max_trials']} trials, {created['max_concurrent_trials']} at a time")
    if not follow_:
        return
    try:
        final = follow_sweep(client, created["id"]) if not as_json else _wait(client, created["id"])
    except KeyboardInterrupt:
        err.print(f"\ndetached; sweep {created['id']} keeps going (`torchyard sweeps cancel {created['id']}` stops it)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        _echo_json(final)
    else:
        _finish(final)
    raise typer.Exit(_EXIT.get(final["status"], EXIT_JOB_FAILED))


def _wait(client: Client, sweep_id: str) -> dict[str, Any]:
    while (s := client.sweep(sweep_id))["status"] == "running":
        time.sleep(2.0)
    return s


@sweeps_app.callback()
@handles_errors
def sweeps_list(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List sweeps, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    items = _settings(ctx).client().list_sweeps()
    if as_json:
        _echo_json(items)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "NAME", "METHOD", "STATUS", "TRIALS", "BEST"):
        table.add_column(col)
    for s in items:
        best = f"#{s['best_trial']} {_value(s['best_value'])}" if s.get("best_trial") is not None else ""
        table.add_row(s["id"], s["name"], s["method"], s["status"], str(s["max_trials"]), best)
    console.print(table)


@sweeps_app.command("show")
@handles_errors
def sweeps_show(ctx: typer.Context, sweep_id: Annotated[str, typer.Argument(help="Sweep id.", show_default=False)],
                as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """A sweep's trials: parameters, state, rung, metric, and the best trial so far."""
    s = _settings(ctx).client().sweep(sweep_id)
    if as_json:
        _echo_json(s)
        return
    _finish(s)


@sweeps_app.command("cancel")
@handles_errors
def sweeps_cancel(ctx: typer.Context, sweep_id: Annotated[str, typer.Argument(help="Sweep id.", show_default=False)]) -> None:
    """Cancel a sweep: no more trials, and every queued or running trial is cancelled."""
    s = _settings(ctx).client().cancel_sweep(sweep_id)
    console.print(f"sweep {s['id']} {s['status']}")
