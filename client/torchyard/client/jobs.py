"""Jobs: submit a spec (a dict, or a YAML/JSON file read by ``load_spec``), list, get, cancel, retry, reprioritise,
delete and wait for jobs, and read their metrics and checkpoints."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from torchyard.client import left_out
from torchyard.client.code_bundles import CodeBundlesApi
from torchyard.client.errors import TorchyardError
from torchyard.client.http import job_path
from torchyard.client.models import Checkpoint, Job, JobPage, MetricPoint

log = logging.getLogger(__name__)


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


class JobsApi(CodeBundlesApi):
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
                  limit: int = 50, cursor: str | None = None, owner: str | None = None) -> JobPage:
        """One page, newest first; pass ``next_cursor`` back as ``cursor`` for the next. ``owner`` (the admin key):
        that owner's jobs, or ``"*"`` for every owner's; without it, the key's own."""
        params: list[tuple[str, str | int]] = [("limit", limit)]
        if owner:
            params.append(("owner", owner))
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
        return Job.model_validate(self._json("GET", job_path(job_id)))

    get = job

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._json("POST", job_path(job_id, "cancel")))

    def set_priority(self, job_id: str, priority: int) -> Job:
        """A queued or running job's new priority (0-100, at most the key's max_priority): a queued job moves in line and
        may preempt lower-priority jobs at once. Conflict (409) once it finished."""
        return Job.model_validate(self._json("PATCH", job_path(job_id), json={"priority": priority}))

    def delete_job(self, job_id: str) -> None:
        """Delete a finished job: its metrics, checkpoints, logs and run directory. Conflict (409) while it is queued or
        running (cancel it first); NotFound for an id that is not the caller's."""
        self._request("DELETE", job_path(job_id))

    def retry(self, job_id: str) -> Job:
        """Run a finished job again from its latest checkpoint; the answer is the new job (its own id)."""
        return Job.model_validate(self._json("POST", job_path(job_id, "retry")))

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
            page = self._json("GET", job_path(job_id, "metrics"), params=params)
            points += [MetricPoint.model_validate(p) for p in page["items"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return points

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        return [Checkpoint.model_validate(c) for c in self._json("GET", job_path(job_id, "checkpoints"))["items"]]
