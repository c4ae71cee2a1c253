"""Following a job live: a Rich progress bar on a terminal, one plain line per event elsewhere
(CI logs, pipes), both fed by ``Client.stream``."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from torchyard.cli.render import fmt_duration, fmt_metric, status_markup
from torchyard.client import CheckpointEvent, Client, EndEvent, Job, MetricEvent, StatusEvent
from torchyard.client.metric_names import shown

THROUGHPUT = ("train/samples_per_s", "train/tokens_per_s")


class RateEstimator:
    """Steps per second over a sliding window of recent (time, step) samples, so the ETA follows the
    current speed rather than an average that includes queueing and start-up."""

    def __init__(self, window_s: float = 30.0):
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, step: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()  # a retry resumed from an earlier checkpoint
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    @property
    def steps_per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def eta_s(self, step: int, total: int | None) -> float | None:
        rate = self.steps_per_s
        if total is None or rate is None:
            return None
        return max(total - step, 0) / rate


@dataclass
class FollowState:
    job: Job
    total: int | None
    status: str = ""
    step: int = 0
    values: dict[str, float] = field(default_factory=dict)
    checkpoints: int = 0
    rate: RateEstimator = field(default_factory=RateEstimator)
    last_seen: int | None = None  # the step of the last metric event this stream sent
    resumed: str | None = None  # set by a metric event whose step goes back (a requeued job resumed), until shown

    def apply(self, event: object) -> None:
        if isinstance(event, StatusEvent):
            self.status = event.status
            extra = event.model_extra or {}
            if isinstance(extra.get("total_steps"), int):
                self.total = extra["total_steps"]  # the trainer's own count beats our estimate from the spec
        elif isinstance(event, MetricEvent):
            if self.last_seen is not None and event.step < self.last_seen:
                self.resumed = f"resumed from a checkpoint: step {event.step} after step {self.last_seen}"
            self.step = self.last_seen = event.step  # may go back when a retry resumes from an earlier checkpoint
            self.values.update(event.values)
            # The trainer's own timestamp: events polled in a batch arrive at once, but were made apart.
            self.rate.add(event.step, event.time)
        elif isinstance(event, CheckpointEvent):
            self.checkpoints += 1
        elif isinstance(event, EndEvent):
            self.status = event.status

    @property
    def throughput(self) -> str:
        for name in THROUGHPUT:
            if name in self.values:
                unit = "tok/s" if "tokens" in name else "samples/s"
                return f"{self.values[name]:,.0f} {unit}"
        return "-"

    @property
    def eta(self) -> str:
        eta = self.rate.eta_s(self.step, self.total)
        return fmt_duration(eta) if eta is not None else "-"

    def summary(self) -> str:
        loss = fmt_metric(shown(self.values, "train/loss"))
        parts = [f"step {self.step}/{self.total or '?'}", f"loss {loss}", self.throughput, f"ETA {self.eta}"]
        if (eval_loss := shown(self.values, "eval/loss")) is not None:
            parts.insert(2, f"eval_loss {fmt_metric(eval_loss)}")
        if "eval/accuracy" in self.values:
            parts.insert(3, f"eval_acc {fmt_metric(self.values['eval/accuracy'])}")
        return "  ".join(parts)


def follow(client: Client, job: Job, console: Console) -> Job:
    """Show the job's progress until it ends; return the final Job. Ctrl-C propagates (the caller
    says the job keeps running)."""
    state = FollowState(job=job, total=job.total_steps, status=job.status, step=job.last_step or 0)
    if console.is_terminal:
        _follow_bar(client, state, console)
    else:
        _follow_lines(client, state, console)
    return client.job(job.id)


def _follow_lines(client: Client, state: FollowState, console: Console, every_s: float = 2.0) -> None:
    """One line per status change and checkpoint; metric lines at most every ``every_s`` seconds (and
    whenever eval metrics arrive), the latest one always printed before a status line, so a CI log
    stays readable for a job that logs every few milliseconds."""
    job_id = state.job.id
    last_print, pending = 0.0, False

    def out(text: str) -> None:
        console.print(f"{job_id} {text}", highlight=False, markup=False, soft_wrap=True)

    for event in client.stream(job_id):
        before = state.status
        state.apply(event)
        if state.resumed:
            out(state.resumed)
            state.resumed = None
        if isinstance(event, MetricEvent):
            now = time.monotonic()
            if now - last_print >= every_s or any(name.startswith("eval/") or name == "val_loss" for name in event.values):
                out(state.summary())
                last_print, pending = now, False
            else:
                pending = True
            continue
        if pending:
            out(state.summary())
            pending = False
        if isinstance(event, StatusEvent) and event.status != before:
            out(event.status + (f" ({event.reason})" if event.reason else ""))
        elif isinstance(event, EndEvent) and event.status != before:
            out(event.status)  # a server that sends only the end event still gets its final line
        elif isinstance(event, CheckpointEvent):
            out(f"checkpoint step {event.step}: {event.path}")


def _follow_bar(client: Client, state: FollowState, console: Console) -> None:
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.fields[status]}"),
        BarColumn(bar_width=None, complete_style="cyan", finished_style="green"),
        MofNCompleteColumn(),
        TextColumn("loss [bold]{task.fields[loss]}[/]"),
        TextColumn("{task.fields[throughput]}"),
        TextColumn("ETA {task.fields[eta]}"),
        console=console,
        transient=False,
        expand=True,
    )
    with progress:
        task = progress.add_task(state.job.name, total=state.total, completed=state.step, status=status_markup(state.status),
                                 loss="-", throughput="-", eta="-")
        for event in client.stream(state.job.id):
            before = state.status
            state.apply(event)
            if state.resumed:
                progress.console.print(f"[dim]{state.resumed}[/]", highlight=False)
                state.resumed = None
            if isinstance(event, StatusEvent) and event.status != before:
                reason = f" ({event.reason})" if event.reason else ""
                progress.console.print(status_markup(event.status), f"[dim]{reason}[/]" if reason else "")
            elif isinstance(event, CheckpointEvent):
                progress.console.print(f"[dim]checkpoint step {event.step}: {event.path}[/]", highlight=False)
            progress.update(task, total=state.total, completed=state.step, status=status_markup(state.status),
                            loss=fmt_metric(shown(state.values, "train/loss")), throughput=state.throughput, eta=state.eta)
