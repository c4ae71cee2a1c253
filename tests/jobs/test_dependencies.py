"""Jobs that wait for jobs: the pure verdict (properties), the submission's check of ``depends_on`` (422 naming the
field, nothing created), and the scheduler's pass against real SQL and Redis (the reason stored on the waiting job;
a job whose dependency failed cancelled with ``dependency_failed``, never placed)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from jobs.scheduling.dependencies import verdict
from jobs.settings import Settings
from jobs.store.models import Job, Status
from tests.api.conftest import app, client, finish_job, key_headers, session_of, start_job  # noqa: F401 - fixtures
from tests.jobs.test_scheduler_pass import _host, _job, _pass

STATUSES = [s.value for s in Status]


@given(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6, unique=True),
       st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(STATUSES)))
def test_ready_only_when_all_succeeded_failed_as_soon_as_one_cannot(deps: list[str], statuses: dict[str, str]) -> None:
    v = verdict(deps, statuses)
    bad = [d for d in deps if statuses.get(d) in (None, "failed", "cancelled")]
    if bad:
        assert v.kind == "fail" and v.dependency == bad[0] and bad[0] in v.reason
        assert ("no longer exists" if bad[0] not in statuses else f"ended {statuses[bad[0]]}") in v.reason
    elif all(statuses[d] == "succeeded" for d in deps):
        assert v.kind == "ready"
    else:
        first = next(d for d in deps if statuses[d] != "succeeded")
        assert v.kind == "wait" and v.reason.startswith(f"waiting for job {first} ({statuses[first]})")


def _script(api: TestClient, headers: dict[str, str] | None = None, **fields: object) -> tuple[int, dict]:
    resp = api.post("/v1/jobs", json={"kind": "script", "name": "d", "entrypoint": "train.py", "parallel": {"device": "cpu"},
                                      **fields}, headers=headers)
    return resp.status_code, resp.json()


def _count(settings: Settings) -> int:
    with session_of(settings) as s:
        return s.exec(sa.select(sa.func.count()).select_from(Job)).scalar_one()  # type: ignore[call-overload]


def test_an_unknown_or_unreadable_dependency_is_422_naming_depends_on_and_creates_nothing(client: TestClient,  # noqa: F811
                                                                                         settings: Settings) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    code, mine = _script(client, alice)
    assert code == 201
    before = _count(settings)
    for deps in (["0123456789abcdef0123"], [mine["id"]]):  # never existed; alice's, seen with bob's key
        code, body = _script(client, bob, depends_on=deps)
        assert code == 422 and body["errors"][0]["field"] == "depends_on" and deps[0] in body["detail"], body
    code, body = _script(client, bob, depends_on=["not-an-id!"])
    assert code == 422 and body["errors"][0]["field"].startswith("depends_on") and "is not a job id" in body["detail"], body
    code, body = _script(client, bob, depends_on=[f"{i:x}" for i in range(33)])
    assert code == 422 and body["errors"][0]["field"].startswith("depends_on"), body
    assert _count(settings) == before


def test_a_pass_holds_a_dependent_job_with_the_reason_and_ends_one_whose_dependency_failed(client: TestClient,  # noqa: F811
                                                                                          settings: Settings) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "cpu-a", 0, cpu_slots=8)
    code, first = _script(client)
    code, other = _script(client)
    start_job(settings, first["id"])
    start_job(settings, other["id"])
    code, later = _script(client, depends_on=[first["id"]])
    code, doomed = _script(client, depends_on=[first["id"], other["id"]])
    assert code == 201
    report = _pass(settings)
    assert later["id"] not in report.placed and doomed["id"] not in report.placed
    assert _job(settings, later["id"]).waiting_reason == f"waiting for job {first['id']} (running)"
    assert _job(settings, doomed["id"]).waiting_reason == f"waiting for job {first['id']} (running) and 1 more"

    finish_job(settings, other["id"], Status.FAILED, reason="exit 1")
    _pass(settings)
    ended = _job(settings, doomed["id"])
    assert (ended.status, ended.error_type) == ("cancelled", "dependency_failed")
    assert other["id"] in ended.error_message and "ended failed" in ended.error_message
    assert _job(settings, later["id"]).status == "queued"

    finish_job(settings, first["id"])
    assert later["id"] in _pass(settings).placed
    assert client.get(f"/v1/jobs/{doomed['id']}").json()["error"]["type"] == "dependency_failed"
