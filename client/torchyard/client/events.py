"""A job's live events: the SSE stream ``GET /v1/jobs/{id}/events``, reopened where it stopped when it drops, or
the same events built by polling a server that has no such endpoint."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import httpx

from torchyard.client.errors import ConnectionFailed, NotFound, error_from_response
from torchyard.client.http import job_path
from torchyard.client.jobs import JobsApi
from torchyard.client.models import CheckpointEvent, EndEvent, Event, MetricEvent, MetricPoint, StatusEvent, parse_event
from torchyard.client.sse import parse_sse

log = logging.getLogger(__name__)

# A stream that drops is reopened with Last-Event-ID this many times in a row before giving up.
_STREAM_RECONNECTS = 20


class EventsApi(JobsApi):
    def stream(self, job_id: str, *, last_event_id: str | None = None, poll_interval: float = 1.0) -> Iterator[Event]:
        """Live status, metric and checkpoint events of a job, ending with an EndEvent once it is terminal.

        Reads the SSE stream ``GET /v1/jobs/{id}/events`` and reopens it with ``Last-Event-ID`` when
        the connection drops or the server ends it at its maximum lifetime (a ``reconnect`` message).
        A server without that endpoint is polled instead, yielding the same event types, so callers
        never care which one they got."""
        try:
            yield from self._sse(job_id, last_event_id)
        except _NoEventsEndpoint:
            log.info("the server has no /events endpoint; polling job %s", job_id)
            yield from self._poll_events(job_id, poll_interval)

    def _sse(self, job_id: str, last_event_id: str | None) -> Iterator[Event]:
        failures, yielded = 0, False
        # Reads can wait for minutes between events on a quiet job; the server's keepalives (if any)
        # or the read timeout decide when to reconnect.
        timeout = httpx.Timeout(self._http.timeout.connect or 10.0, read=120.0)
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_event_id:
                headers["Last-Event-ID"] = last_event_id
            try:
                with self._http.stream("GET", job_path(job_id, "events"), headers=headers, timeout=timeout) as response:
                    if response.status_code == 404 and not yielded:
                        response.read()
                        self.job(job_id)  # raises NotFound when the job is what is missing
                        raise _NoEventsEndpoint
                    if response.is_error:
                        response.read()
                        raise error_from_response(response)
                    reconnect = False
                    for raw in parse_sse(response.iter_lines()):
                        failures = 0
                        if raw.id is not None:
                            last_event_id = raw.id
                        if raw.event == "reconnect":
                            reconnect = True  # the stream reached its lifetime on the server: resume at once
                            break
                        try:
                            data = json.loads(raw.data)
                        except ValueError:
                            data = raw.data
                        event = parse_event(raw.event, data, raw.id)
                        yielded = True
                        yield event
                        if isinstance(event, EndEvent):
                            return
            except httpx.TransportError as exc:
                failures += 1
                if failures > _STREAM_RECONNECTS:
                    raise ConnectionFailed(f"event stream of job {job_id} keeps failing: {exc}") from exc
                log.warning("event stream of job %s broke (%s); resuming after %s", job_id, exc, last_event_id)
                time.sleep(min(0.5 * failures, 5.0))
                continue
            if reconnect:
                continue
            # The server closed the stream without an end event (a restart, a proxy timeout): resume.
            failures += 1
            if failures > _STREAM_RECONNECTS:
                raise ConnectionFailed(f"event stream of job {job_id} keeps closing without an end event")
            time.sleep(min(0.5 * failures, 5.0))

    def _poll_events(self, job_id: str, poll_interval: float) -> Iterator[Event]:
        seen_metrics: set[tuple[int, str]] = set()
        seen_checkpoints: set[tuple[int, str]] = set()
        last_step = 0
        last_status: tuple[str, int] | None = None
        while True:
            job = self.job(job_id)
            # Metrics at or after the last step seen (since_step is inclusive): eval points can land
            # after the train points of the same step.
            fresh = [p for p in self.metrics(job_id, since_step=last_step) if (p.step, p.name) not in seen_metrics]
            by_step: dict[int, list[MetricPoint]] = {}
            for p in fresh:
                seen_metrics.add((p.step, p.name))
                by_step.setdefault(p.step, []).append(p)
            # Metrics and checkpoints interleaved by step, as a live stream would have sent them.
            batch: list[tuple[int, int, Event]] = []
            for step, group in by_step.items():
                values = {p.name: p.value for p in group}
                batch.append((step, 0, MetricEvent(step=step, epoch=group[0].epoch, values=values, time=max(p.time for p in group))))
                last_step = max(last_step, step)
            try:
                checkpoints = self.checkpoints(job_id)
            except NotFound:
                checkpoints = []
            for c in checkpoints:
                if (c.step, c.path) not in seen_checkpoints:
                    seen_checkpoints.add((c.step, c.path))
                    event = CheckpointEvent(step=c.step, epoch=c.epoch, path=c.path, created_at=c.created_at, details=c.details)
                    batch.append((c.step, 1, event))
            for _, _, event in sorted(batch, key=lambda item: item[:2]):
                yield event
            if (job.status, job.attempt) != last_status:
                last_status = (job.status, job.attempt)
                yield StatusEvent(status=job.status, at=job.updated_at, attempt=job.attempt)
            if job.terminal:
                yield EndEvent(status=job.status)
                return
            time.sleep(poll_interval)


class _NoEventsEndpoint(Exception):
    """The server predates GET /v1/jobs/{id}/events."""
