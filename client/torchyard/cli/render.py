"""How jobs, metrics and times look in the terminal."""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from torchyard.client import Checkpoint, Job, MetricPoint
from torchyard.client.metric_names import shown

PER_RANK = re.compile(r"^sys/rank\d+/")
# Metrics in bytes and in percent, shown as the dashboard shows them ("337.7 MiB", "12.5%").
BYTES = re.compile(r"(_bytes|/gpu_mem_used|/gpu_mem_total)$")
PERCENT = re.compile(r"(_percent|/gpu_util)$")

STATUS_STYLE = {
    "queued": "yellow", "running": "cyan", "cancelling": "magenta", "succeeded": "green", "failed": "bold red", "cancelled": "dim",
}


def status_markup(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]" if status else ""


def fmt_metric(value: float | None) -> str:
    if value is None:
        return "-"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{value:.1f} {units[i]}" if i else f"{value:.0f} B"


def fmt_value(name: str, value: float | None) -> str:
    """A metric's value in its unit: bytes in KiB/MiB/GiB, percentages with %, the rest as numbers."""
    if value is not None and BYTES.search(name):
        return fmt_bytes(value)
    if value is not None and PERCENT.search(name):
        return f"{value:.1f}%"
    return fmt_metric(value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def fmt_age(when: datetime | None, now: datetime | None = None) -> str:
    if when is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return fmt_duration(max((now - when).total_seconds(), 0)) + " ago"


def progress_cell(job: Job) -> str:
    step, total = job.last_step, job.total_steps
    if step is None:
        return "-"
    if not total:
        return str(step)
    return f"{step}/{total} {min(step / total, 1.0):4.0%}"


def duration(job: Job) -> str:
    if job.started_at is None:
        return "-"
    end = job.finished_at or datetime.now(timezone.utc)
    return fmt_duration((end - job.started_at).total_seconds())


def jobs_table(jobs: list[Job], owners: bool = False) -> Table:
    """One row a job; ``owners``: with an OWNER column (the admin's list of other owners' jobs)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", *(("OWNER",) if owners else ()), "NAME", "STATUS", "PRI", "STEP", "LOSS", "ATTEMPT", "CREATED", "RAN"):
        table.add_column(col, no_wrap=col in ("ID", "STATUS"), justify="right" if col == "PRI" else "left")
    for job in jobs:
        table.add_row(
            job.id, *((Text(job.owner or ""),) if owners else ()), Text(job.name), status_markup(job.status), str(job.priority),
            progress_cell(job),
            fmt_metric(shown(job.latest_metrics, "train/loss")),
            f"{job.attempt}/{job.max_attempts}" if job.max_attempts else str(job.attempt), fmt_age(job.created_at), duration(job),
        )
    return table


def job_panel(job: Job, checkpoints: list[Checkpoint] | None = None) -> Panel:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("id", job.id)
    where = f"  (queue position {job.queue_position})" if job.queue_position is not None else ""
    facts.add_row("status", status_markup(job.status) + where)
    if job.status == "queued" and job.waiting_reason:
        facts.add_row("waiting", Text(job.waiting_reason))
    elif job.stop_request:
        facts.add_row("stopping", Text(f"{job.stop_request}; checkpointing, then back in line"))
    facts.add_row("priority", str(job.priority) + ("" if job.preemptible else ", not preemptible")
                  + (", on borrowed GPUs" if job.borrowed and job.status == "running" else ""))
    for t in job.preemptions:
        facts.add_row("preempted", Text(f"{t.get('at', '')[:19].replace('T', ' ')}  {t.get('reason', '')}"))
    facts.add_row("attempt", f"{job.attempt}/{job.max_attempts}" if job.max_attempts else str(job.attempt))
    facts.add_row("progress", progress_cell(job))
    facts.add_row(*spec_row(job.spec))
    if job.secrets:
        facts.add_row("secrets", Text(", ".join(job.secrets) + " (values never shown)"))
    facts.add_row("created", f"{job.created_at:%Y-%m-%d %H:%M:%S} ({fmt_age(job.created_at)})" if job.created_at else "-")
    facts.add_row("ran", duration(job))
    if job.worker_id:
        facts.add_row("worker", Text(job.worker_id))
    if job.run_dir:
        facts.add_row("run dir", Text(job.run_dir))
    if job.labels:
        facts.add_row("labels", Text(", ".join(f"{k}={v}" for k, v in job.labels.items())))
    parts: list[object] = [facts]
    if job.latest_metrics:
        metrics = Table(box=None, header_style="bold", title="latest metrics", title_justify="left", title_style="bold")
        metrics.add_column("metric")
        metrics.add_column("value", justify="right")
        for name in sorted(job.latest_metrics):
            if not PER_RANK.match(name):  # sys/rankN/...: one row per rank would drown the rest; the API has them
                metrics.add_row(name, fmt_value(name, job.latest_metrics[name]))
        parts.append(metrics)
    if checkpoints:
        parts.append(Text(checkpoints_line(checkpoints)))
    if job.error:
        err = job.error
        head = Text.assemble((err.type or "error", "bold red"), ": ", err.message or "")
        if err.exit_code is not None:
            head.append(f"\nexit code {err.exit_code}")
        parts.append(head)
        tail = err.log_tail or err.traceback
        if tail:
            parts.append(Text("\n".join(tail.rstrip().splitlines()[-15:]), style="dim"))
    return Panel(Group(*parts), title=Text(job.name, style="bold"), title_align="left", expand=False)  # type: ignore[arg-type]


def spec_row(spec: dict) -> tuple[str, Text]:
    """What runs: a script's command line, or the catalog model on its dataset; and on how many ranks."""
    parallel = spec.get("parallel") or {}
    nproc, nnodes = parallel.get("nproc_per_node", 1), parallel.get("nnodes", 1)
    ranks = f"{nproc} x {nnodes} nodes" if nnodes != 1 else f"x {nproc}"
    if spec.get("kind") == "script":
        return "script", Text(f"{shlex.join([spec.get('entrypoint', '-'), *spec.get('args', [])])}, {ranks}")
    model = (spec.get("model") or {}).get("name", "-")
    data = (spec.get("data") or {}).get("name", "-")
    return "spec", Text(f"{model} on {data}, {parallel.get('strategy', 'ddp')} {ranks}")


def checkpoints_line(checkpoints: list[Checkpoint]) -> str:
    """The kept checkpoints only; those keep_last deleted are counted apart, never offered as the latest."""
    kept = [c for c in checkpoints if c.available]
    pruned = len(checkpoints) - len(kept)
    line = f"checkpoints: {len(kept)}"
    if kept:
        line += f", latest step {kept[-1].step}: {kept[-1].path}"
    return line + (f" ({pruned} older pruned by keep_last)" if pruned else "")


# Short column headers so the usual metrics fit an 80-column terminal.
SHORT_NAMES = {
    "train/loss": "loss", "eval/loss": "eval_loss", "eval/accuracy": "eval_acc", "train/samples_per_s": "samples/s",
    "train/tokens_per_s": "tokens/s", "train/lr": "lr", "train/grad_norm": "grad_norm", "train/step_time_s": "step_s",
}
_ORDER = list(SHORT_NAMES)


def metrics_table(points: list[MetricPoint], last: int | None) -> Table:
    """One row per step, one column per metric name; the last ``last`` steps when given."""
    names = sorted({p.name for p in points}, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    rows: dict[int, dict[str, float]] = {}
    for p in points:
        rows.setdefault(p.step, {})[p.name] = p.value
    steps = sorted(rows)
    if last:
        steps = steps[-last:]
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("step", justify="right")
    for name in names:
        table.add_column(SHORT_NAMES.get(name, name), justify="right")
    for step in steps:
        table.add_row(str(step), *(fmt_value(name, rows[step].get(name)) if name in rows[step] else "" for name in names))
    return table
