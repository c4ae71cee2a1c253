"""A retry is a new job made the way a submission makes one: the same columns from the same spec, the old
job's secrets, a queued slot, and its lineage (``retry_of``, ``resume_from`` its latest checkpoint)."""

from __future__ import annotations

import sqlalchemy as sa
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr

from api.app import create_app
from jobs.infra import secrets
from jobs.settings import Settings
from jobs.store import limits
from jobs.store.models import Job, Status
from tests.api.conftest import ADMIN, finish_job, ingest, mlp_spec, session_of, start_job

# Set per job, or by the scheduler's pass whenever it runs.
_OWN = {"id", "created_at", "updated_at", "retry_of", "resume_from", "queue_position", "waiting_reason"}


def test_a_retry_has_a_submissions_columns_secrets_and_counter_plus_its_lineage(settings: Settings) -> None:
    keyed = settings.model_copy(update={"secrets_key": SecretStr(Fernet.generate_key().decode())})
    body = mlp_spec(retries=2, priority=70, preemptible=False, labels={"team": "vision"}, secrets={"HF_TOKEN": "hf_s3cret"})
    with TestClient(create_app(keyed), headers=ADMIN) as client:
        old = client.post("/v1/jobs", json=body).json()
        run_dir = start_job(keyed, old["id"])
        ingest(keyed, old["id"], [{"seq": 1, "time": 1.0, "type": "checkpoint", "step": 10, "epoch": 0,
                                   "path": "checkpoints/step_00000010"}])
        finish_job(keyed, old["id"], Status.FAILED, reason="torchrun exited 1")
        retried = client.post(f"/v1/jobs/{old['id']}/retry")
        assert retried.status_code == 201, retried.text
        assert retried.json()["status"] == "queued" and retried.json()["secrets"] == ["HF_TOKEN"]
        fresh = client.post("/v1/jobs", json=body).json()
    with session_of(keyed) as s:
        rows = {job.id: job for job in s.exec(sa.select(Job)).scalars()}  # type: ignore[call-overload]
        new, submitted = rows[retried.json()["id"]], rows[fresh["id"]]
        assert new.model_dump(exclude=_OWN) == submitted.model_dump(exclude=_OWN)
        assert new.retry_of == old["id"] and submitted.retry_of is None
        assert new.resume_from == str(run_dir / "checkpoints/step_00000010")
        assert secrets.load(s, new.id, keyed) == {"HF_TOKEN": "hf_s3cret"}
        assert limits.queued_jobs(s, "admin") == limits.count(s, "admin", (Status.QUEUED.value,)) == 2
