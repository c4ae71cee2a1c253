"""A job's objects in the store removed with it: by ``DELETE /v1/jobs/{id}`` (jobs/job_control.py) and by retention
(jobs/retention.py). A store that does not answer leaves them, said in the log; retention tries again in its next
pass, and once a process has removed a job's objects it does not ask the store about that job again."""

from __future__ import annotations

import logging

from jobs.settings import Settings
from jobs.storage.checkpoints import delete_job
from jobs.storage.store import StoreError, store_for

log = logging.getLogger(__name__)

_expired: set[str] = set()  # jobs whose objects retention removed in this process


def remove(settings: Settings, job_id: str, keep: str | None = None) -> bool:
    """Remove the job's objects but ``keep`` (a path in its run directory); True when the store has none left (or
    there is no store)."""
    store = store_for(settings)
    if store is None:
        return True
    try:
        removed = delete_job(store, job_id, keep)
    except StoreError as exc:
        log.warning("job %s: its objects stay in the store for now: %s", job_id, exc, extra={"job_id": job_id})
        return False
    if removed:
        log.info("job %s: %d objects removed from the store%s", job_id, removed, f" (kept {keep})" if keep else "",
                 extra={"job_id": job_id})
    return True


def expire(settings: Settings, job_id: str, keep: str | None) -> None:
    """Retention's removal: once per job and process."""
    if settings.storage_url is not None and job_id not in _expired and remove(settings, job_id, keep):
        _expired.add(job_id)
