"""A job whose first attempt failed and whose retry succeeded shows no top-level error in GET /v1/jobs/{id}:
the failure stays on the first attempt's record, its type and message."""

from __future__ import annotations

import pytest

from tests.helpers import Services

pytestmark = pytest.mark.slow

SCRIPT = 'import os, sys\nif os.environ["TORCHYARD_ATTEMPT"] == "1":\n    sys.exit("first attempt fails")\nprint("ok")\n'


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_a_retry_that_succeeds_clears_the_jobs_error_and_the_attempt_keeps_it(services: Services) -> None:
    (services.settings.code_dir / "flaky.py").write_text(SCRIPT)
    services.start_api()
    services.start_worker()
    with services.client() as client:
        created = client.post("/v1/jobs", json={"kind": "script", "name": "flaky", "entrypoint": "flaky.py", "retries": 1})
        assert created.status_code == 201, created.text
        job = services.wait_status(client, created.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=180)
        listed = client.get("/v1/jobs").json()["items"]
    assert job["status"] == "succeeded"
    assert job["error"] is None
    assert [j["error"] for j in listed if j["id"] == job["id"]] == [None]
    first, last = job["attempts"]
    assert (first["outcome"], first["error_type"]) == ("failed", "training_error")
    assert first["error_message"].startswith("rank 0 exited with code 1")
    assert (last["outcome"], last["error_type"], last["error_message"]) == ("succeeded", None, None)
