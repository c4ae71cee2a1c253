"""The synchronous torchyard client: one method per API call, typed results, problem+json errors
raised as exceptions, cursors followed for you, and a live event stream that resumes itself."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from client import left_out
from client.config import ClientConfig, load_config
from client.errors import ApiError, ConnectionFailed, NotFound, TorchyardError, error_from_response
from client.models import (
    ApiKey,
    Artifact,
    Checkpoint,
    CheckpointEvent,
    CodeBundle,
    EndEvent,
    Event,
    Host,
    Job,
    JobPage,
    MetricEvent,
    MetricPoint,
    Quota,
    StatusEvent,
    parse_event,
)
from client.pack import pack
from client.sse import parse_sse

log = logging.getLogger(__name__)

USER_AGENT = "torchyard-client/0.1"
# A stream that drops is reopened with Last-Event-ID this many times in a row before giving up.
_STREAM_RECONNECTS = 20


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read a job spec from a YAML or JSON file (the API takes JSON; YAML is read here)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TorchyardError(f"{p}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TorchyardError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise TorchyardError(f"{p}: a job spec must be a mapping, got {type(data).__name__}")
    return data


class Client:
    """``Client(url, key)``; or ``Client.from_config()`` to read TORCHYARD_URL / TORCHYARD_API_KEY
    or ~/.config/torchyard/config.toml. Use as a context manager to close its connections."""

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    @classmethod
    def from_config(cls, config: ClientConfig | None = None, **kwargs: Any) -> Client:
        config = config or load_config()
        return cls(config.url, config.api_key, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach the torchyard API at {self.url}: {exc}") from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # ------------------------------------------------------------------ health

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def ready(self) -> dict[str, Any]:
        return self._json("GET", "/readyz")

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: dict[str, Any] | str | Path, *, workdir: str | Path | None = None,
               idempotency_key: str | None = None) -> Job:
        """Submit a spec (a dict, or the path of a YAML/JSON file). Raises InvalidRequest naming the
        field when the spec cannot run. With ``workdir`` (a ``kind: script`` spec) the directory is
        packed and uploaded first (once: an unchanged directory is not sent again) and the job runs
        its entrypoint from there."""
        body = dict(spec) if isinstance(spec, dict) else load_spec(spec)
        if workdir is not None:
            if body.get("kind") != "script":
                raise TorchyardError("--workdir / workdir= needs a 'kind: script' spec (its entrypoint runs from the directory)")
            for item in left_out.check(workdir, str(body.get("entrypoint", ""))):
                log.warning("%s", item.message())
            body["code"] = self.upload_code(workdir).digest
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return Job.model_validate(self._json("POST", "/v1/jobs", json=body, headers=headers))

    def list_jobs(self, *, status: str | list[str] | None = None, name: str | None = None, labels: dict[str, str] | None = None,
                  limit: int = 50, cursor: str | None = None) -> JobPage:
        """One page, newest first; pass ``next_cursor`` back as ``cursor`` for the next."""
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("status", s) for s in ([status] if isinstance(status, str) else status or [])]
        if name:
            params.append(("name", name))
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if cursor:
            params.append(("cursor", cursor))
        return JobPage.model_validate(self._json("GET", "/v1/jobs", params=params))

    def iter_jobs(self, **filters: Any) -> Iterator[Job]:
        """Every matching job, newest first, following cursors."""
        cursor = None
        while True:
            page = self.list_jobs(cursor=cursor, **filters)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def job(self, job_id: str) -> Job:
        return Job.model_validate(self._json("GET", f"/v1/jobs/{job_id}"))

    get = job

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._json("POST", f"/v1/jobs/{job_id}/cancel"))

    def retry(self, job_id: str) -> Job:
        """Run a finished job again from its latest checkpoint; the answer is the new job (its own id)."""
        return Job.model_validate(self._json("POST", f"/v1/jobs/{job_id}/retry"))

    def wait(self, job_id: str, *, timeout: float | None = None, poll_interval: float = 1.0) -> Job:
        """Poll until the job is succeeded, failed or cancelled and return it; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.terminal:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout:.0f}s")
            time.sleep(poll_interval)

    def metrics(self, job_id: str, names: str | list[str] | None = None, *, since_step: int | None = None) -> list[MetricPoint]:
        """Every metric point (following cursors), ordered by step then name."""
        base: list[tuple[str, str | int]] = [("limit", 10_000)]
        base += [("name", n) for n in ([names] if isinstance(names, str) else names or [])]
        if since_step is not None:
            base.append(("since_step", since_step))
        points: list[MetricPoint] = []
        cursor = None
        while True:
            params = base + ([("cursor", cursor)] if cursor else [])
            page = self._json("GET", f"/v1/jobs/{job_id}/metrics", params=params)
            points += [MetricPoint.model_validate(p) for p in page["items"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return points

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        return [Checkpoint.model_validate(c) for c in self._json("GET", f"/v1/jobs/{job_id}/checkpoints")["items"]]

    def logs(self, job_id: str, *, rank: int | str | None = None, tail: int | None = None, stream: str | None = None,
             attempt: int | None = None) -> str:
        """A log of the job's current (or given) attempt: every rank's output merged, each line prefixed
        ``[rank N]``; with ``rank`` that rank's stdout and stderr as printed (or only ``stream``, "stdout"
        or "stderr"); ``rank="launcher"`` for torchrun's own log."""
        params = _log_params(rank, tail, stream, attempt)
        return self._request("GET", f"/v1/jobs/{job_id}/logs", params=params, headers={"Accept": "text/plain"}).text

    def follow_logs(self, job_id: str, *, rank: int | str | None = None, tail: int | None = None, stream: str | None = None,
                    attempt: int | None = None) -> Iterator[str]:
        """Chunks of log text as they are written, until the attempt ends and the server closes the stream. A stream
        the server ends at its maximum lifetime is resumed where it stopped, on the same attempt."""
        params: dict[str, int | str] = {**_log_params(rank, tail, stream, attempt), "follow": "true"}
        while True:
            position: str | None = None
            try:
                with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, headers={"Accept": "text/plain"},
                                       timeout=httpx.Timeout(self._http.timeout.connect, read=None)) as response:
                    if response.is_error:
                        response.read()
                        raise error_from_response(response)
                    if response.headers.get("X-Log-Attempt", "").isdigit():  # a resumed stream stays on this attempt
                        params["attempt"] = int(response.headers["X-Log-Attempt"])
                    held = ""  # text from a 0x1e on, until it is known not to be the reconnect marker
                    for chunk in response.iter_text():
                        text, held = _split_marker(held + chunk)
                        if text:
                            yield text
                    if held.startswith(_RECONNECT) and held.endswith("\n"):
                        position = held[len(_RECONNECT):].strip()
                    elif held:
                        yield held
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"log stream from {self.url} broke: {exc}") from exc
            if position is None:
                return
            params.pop("tail", None)
            params["position"] = position

    def download_weights(self, job_id: str, dest: str | Path | None = None, *, step: int | None = None) -> Path:
        """Save the consolidated weights of the latest checkpoint that has them (or of ``step``) to ``dest``
        (a file, or a directory to put the server's file name in; default the current directory)."""
        path = f"/v1/jobs/{job_id}/weights" if step is None else f"/v1/jobs/{job_id}/checkpoints/{step}/weights"

        def target_for(response: httpx.Response) -> Path:
            target = Path(dest) if dest is not None else Path.cwd()
            if target.is_dir():
                target = target / (_attachment_name(response.headers.get("content-disposition")) or f"{job_id}.safetensors")
            return target

        return self._download(path, target_for)

    def download_checkpoint_archive(self, job_id: str, step: int, dest: str | Path | None = None) -> Path:
        """Save a directory checkpoint (a Hugging Face ``checkpoint-N/``, an Accelerate ``save_state`` directory) as a
        tar file to ``dest`` (a file, or a directory to put the server's file name in; default the current directory)."""

        def target_for(response: httpx.Response) -> Path:
            target = Path(dest) if dest is not None else Path.cwd()
            if target.is_dir():
                target = target / (_attachment_name(response.headers.get("content-disposition")) or f"{job_id}-step{step}.tar")
            return target

        return self._download(f"/v1/jobs/{job_id}/checkpoints/{step}/archive", target_for)

    def artifacts(self, job_id: str) -> list[Artifact]:
        """Files the job wrote under its run's ``artifacts/`` directory (TensorBoard events, profiler traces ...)."""
        return [Artifact.model_validate(a) for a in self._json("GET", f"/v1/jobs/{job_id}/artifacts")["items"]]

    def download_artifact(self, job_id: str, path: str, dest: str | Path) -> Path:
        """Save the artifact ``path`` (relative to ``artifacts/``) to the file ``dest``, creating its directory."""
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        quoted = "/".join(quote(part, safe="") for part in path.split("/"))
        return self._download(f"/v1/jobs/{job_id}/artifacts/{quoted}", lambda _: target)

    def _download(self, path: str, target_for: Callable[[httpx.Response], Path]) -> Path:
        """Stream ``path`` into the file ``target_for(response)`` names, written whole or not at all."""
        try:
            with self._http.stream("GET", path, headers={"Accept": "application/octet-stream"}) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                target = target_for(response)
                tmp = target.with_name(f".{target.name}.part")
                with tmp.open("wb") as out:
                    for block in response.iter_bytes(1 << 20):
                        out.write(block)
                tmp.replace(target)  # never a half-written file under the final name
                return target
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"download from {self.url} broke: {exc}") from exc

    # ------------------------------------------------------------------ code bundles

    def code_exists(self, digest: str) -> bool:
        """Whether the server already has this bundle for this key's owner."""
        try:
            self._request("HEAD", f"/v1/code/{digest}")
        except NotFound:
            return False
        return True

    def upload_code(self, workdir: str | Path) -> CodeBundle:
        """Pack ``workdir`` (honouring .gitignore and .torchyardignore, without .git) and upload it unless
        the server already has the same archive; the bundle's ``digest`` goes in a spec's ``code``."""
        with pack(workdir) as packed:
            if self.code_exists(packed.digest):
                return CodeBundle(digest=packed.digest, size_bytes=packed.size_bytes, files=packed.files, uploaded=False)
            gzip = packed.compressible()
            headers = {"Content-Type": "application/x-tar", **({"Content-Encoding": "gzip"} if gzip else {})}
            response = self._request("POST", "/v1/code", params={"digest": packed.digest}, content=packed.chunks(gzip=gzip),
                                     headers=headers, timeout=httpx.Timeout(self._http.timeout.connect, read=600.0, write=600.0))
            return CodeBundle.model_validate({**response.json(), "uploaded": response.status_code == 201})

    # ------------------------------------------------------------------ live events

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
                with self._http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout) as response:
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

    def create_sweep(self, sweep: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Start a sweep (POST /v1/sweeps); the answer is the sweep as a dict (its trials come as the controller
        creates them). Raises InvalidRequest naming the field of a bad space, method or metric."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/sweeps", json=sweep, headers=headers)

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        """A sweep with its trials: parameters, state, rung, metric values, and the best trial so far."""
        return self._json("GET", f"/v1/sweeps/{quote(sweep_id, safe='')}")

    def list_sweeps(self, *, limit: int = 50) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/sweeps", params={"limit": limit})["items"]

    def cancel_sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/sweeps/{quote(sweep_id, safe='')}/cancel")

    def hosts(self) -> list[Host]:
        """The workers' hosts: GPUs (each with the job holding it, when the caller may see it) and CPU slots."""
        return [Host.model_validate(h) for h in self._json("GET", "/v1/hosts")["items"]]

    # ------------------------------------------------------------------ quotas

    def quotas(self) -> list[Quota]:
        """Every owner's quota and use (the admin), or the caller's own."""
        return [Quota.model_validate(q) for q in self._json("GET", "/v1/quotas")["items"]]

    def set_quota(self, owner: str, gpus: int | None = None, cpu_slots: int | None = None) -> Quota:
        """Guarantee ``owner`` these GPUs and CPU slots (admin); None: no limit on that resource."""
        return Quota.model_validate(self._json("PUT", f"/v1/quotas/{owner}", json={"gpus": gpus, "cpu_slots": cpu_slots}))

    def delete_quota(self, owner: str) -> None:
        self._request("DELETE", f"/v1/quotas/{owner}")

    # ------------------------------------------------------------------ keys (admin)

    def create_key(self, owner: str, name: str, queues: list[str] | None = None, *, max_priority: int | None = None,
                   may_protect: bool = False) -> ApiKey:
        """A new key for ``owner`` (limited to ``queues`` when given, submitting at most at ``max_priority``); the secret
        is in ``.key`` and is shown only this once."""
        body: dict[str, Any] = {"owner": owner, "name": name, "may_protect": may_protect}
        if queues is not None:
            body["queues"] = queues
        if max_priority is not None:
            body["max_priority"] = max_priority
        return ApiKey.model_validate(self._json("POST", "/v1/keys", json=body))

    def list_keys(self) -> list[ApiKey]:
        body = self._json("GET", "/v1/keys")
        items = body["items"] if isinstance(body, dict) else body
        return [ApiKey.model_validate(k) for k in items]

    def revoke_key(self, key_id: str) -> None:
        self._request("DELETE", f"/v1/keys/{key_id}")


class _NoEventsEndpoint(Exception):
    """The server predates GET /v1/jobs/{id}/events."""


def _attachment_name(disposition: str | None) -> str | None:
    """The file name of a Content-Disposition header, without any directory part."""
    if not disposition:
        return None
    for part in disposition.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "filename" and value:
            return Path(value.strip('"')).name or None
    return None


# How the server ends a followed log at its maximum lifetime (jobs.job_logs.RECONNECT_MARKER): then a position, a newline.
_RECONNECT = "\x1etorchyard-reconnect "


def _split_marker(text: str) -> tuple[str, str]:
    """``text`` cut into what can be shown now and what may be the start of the reconnect marker (held back)."""
    at = text.rfind("\x1e")
    if at == -1:
        return text, ""
    tail = text[at:]
    if _RECONNECT.startswith(tail[:len(_RECONNECT)]) and "\n" not in tail[:-1]:
        return text[:at], tail
    return text, ""


def _log_params(rank: int | str | None, tail: int | None, stream: str | None, attempt: int | None) -> dict[str, int | str]:
    given = {"rank": rank, "tail": tail, "stream": stream, "attempt": attempt}
    return {k: v for k, v in given.items() if v is not None}


__all__ = ["ApiError", "Client", "load_spec"]
