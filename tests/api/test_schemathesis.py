"""Property-based run over the OpenAPI schema (schemathesis, in-process against the ASGI app):
no 5xx, every response matches the documented status codes, content types, headers and schemas."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from jobs.settings import Settings
from tests.api.conftest import ADMIN, finish_job, ingest, metric_event, start_job
from tests.quick_examples import examples, quick

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """SQLite only: the live run (tests/security/test_schemathesis_live.py) covers PostgreSQL with ten times the
    examples per operation, so a second database here would double the quick loop's heaviest file and find nothing new."""
    return sqlite_url


@pytest.fixture
def api_schema(app: FastAPI) -> schemathesis.BaseSchema:
    # The quick loop leaves out the coverage phase (boundary values, each required parameter left out), half of this
    # file's time; `make test` runs it here and against the live server (tests/security/test_schemathesis_live.py).
    config = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": not quick()}}})
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


@pytest.fixture
def finished_job(app: FastAPI, settings: Settings) -> str:
    """A finished job with metrics, a checkpoint with weights and logs, so job routes answer 200 too."""
    from fastapi.testclient import TestClient

    with TestClient(app, headers=ADMIN) as c:
        job_id = c.post("/v1/jobs", json={"name": "st", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
                                          "train": {"global_batch_size": 8}}).json()["id"]
    run_dir = start_job(settings, job_id)
    ckpt = run_dir / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (run_dir / "logs" / "attempt-1").mkdir(parents=True)
    (run_dir / "logs" / "attempt-1" / "launcher.log").write_text("hello\n")
    ingest(settings, job_id, [metric_event(1, 10), {"seq": 2, "time": 2.0, "type": "checkpoint", "step": 10,
                                                    "path": "checkpoints/step_00000010",
                                                    "weights": "checkpoints/step_00000010/model.safetensors"}])
    finish_job(settings, job_id)
    return job_id


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.timeout(1800)  # every operation as a subtest of this one test: far past 300 s on a loaded machine
@schema.parametrize()
@hypothesis_settings(max_examples=examples(12), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case: schemathesis.Case, finished_job: str) -> None:
    # Half the generated job ids are swapped for a real one, so success responses are checked too.
    job_id = (case.path_parameters or {}).get("job_id")
    if isinstance(job_id, str) and len(job_id) % 2 == 0:
        case.path_parameters["job_id"] = finished_job  # type: ignore[index]
    case.call_and_validate(headers=ADMIN, checks=CHECKS)
