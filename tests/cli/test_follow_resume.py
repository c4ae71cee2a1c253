"""``--follow`` across a requeue, from the events the feed sends: the resume is said once and the steps go on from
it; the job's history is not shown again."""

from __future__ import annotations

import io
from collections.abc import Iterator

from rich.console import Console

from torchyard.cli.follow import FollowState, _follow_lines
from torchyard.client import EndEvent, Job, MetricEvent, StatusEvent


class _Feed:
    """The one call _follow_lines makes of a Client: the job's events, as the server's feed sends them."""

    def __init__(self, events: list[object]) -> None:
        self.events = events

    def stream(self, job_id: str) -> Iterator[object]:
        return iter(self.events)


def test_follow_says_the_resume_and_goes_on_from_it() -> None:
    events: list[object] = [
        StatusEvent(status="running", reason="placed on w1", attempt=1),
        *[MetricEvent(step=s, values={"train/loss": 1.0 / s}) for s in (10, 20, 30, 40, 50)],
        StatusEvent(status="queued", reason="worker w1 stopped heart-beating (lease expired); requeued", attempt=2),
        StatusEvent(status="running", reason="placed on w2", attempt=2),
        *[MetricEvent(step=s, values={"train/loss": 0.5 / s}) for s in (40, 50, 60)],
        StatusEvent(status="succeeded", reason="torchrun exited 0", attempt=2),
        EndEvent(status="succeeded"),
    ]
    out = io.StringIO()
    job = Job(id="j1", name="nano", status="queued")
    _follow_lines(_Feed(events), FollowState(job=job, total=60), Console(file=out, width=200), every_s=0.0)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "j1 resumed from a checkpoint: step 40 after step 50" in lines
    after = lines[lines.index("j1 resumed from a checkpoint: step 40 after step 50"):]
    steps = [line.split()[2] for line in after if line.startswith("j1 step ")]
    assert steps == ["40/60", "50/60", "60/60"]
