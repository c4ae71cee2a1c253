"""Schemathesis against a live API process (uvicorn, as ``python -m api`` serves it), with a tenant's key and a
second owner's: every generated request, per operation and in stateful sequences along the OpenAPI links, passes
all of schemathesis' checks and one of our own, that nothing owner A has is reachable with owner B's key.

Three runs, bounded (a fixed number of derandomized examples per operation and of stateful sequences; about two
minutes on two busy cores): generated data per operation, the coverage phase (boundaries, missing parameters, methods
the path does not have, with Allow checked on 405 too), and stateful sequences along the OpenAPI links.
It fails on any 5xx, status, header, content type or body the OpenAPI does not state, valid data refused, invalid
data accepted, a request without a key that is not refused, and any cross-owner access.

Valid data may still be refused where the OpenAPI cannot state the server's rule: a spec names models, datasets
and queues that must exist, a key's queues must be among TORCHYARD_QUEUES, a code bundle is a tar archive, and a
log's ``stream`` needs a rank number. Those answers must be 422 problem+json naming the field; nothing else is let by.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
    use_after_free,
)
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.core.parameters import ParameterLocation

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from stack.redis_server import RedisServer
from tests.api.conftest import finish_job, ingest, metric_event, start_job
from tests.conftest import POSTGRES, _postgres_database, make_settings
from tests.helpers import Services

# Each test below is one pytest test that runs every operation of the API as its subtests: the file took 125-307 s on
# an idle machine, 556 s at load 8, and its first test over 1,800 s at load 15 (two suites side by side).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
log = logging.getLogger(__name__)

# About 100 s on two busy cores; the environment can raise them for a longer run.
EXAMPLES = int(os.environ.get("TORCHYARD_SCHEMATHESIS_EXAMPLES", "120"))
STATEFUL_STEPS = int(os.environ.get("TORCHYARD_SCHEMATHESIS_STEPS", "80"))
# What a rule the OpenAPI cannot state answers for data its schema admits (see the module's docstring).
SEMANTIC = {("POST", "/v1/jobs"), ("POST", "/v1/keys"), ("POST", "/v1/code"), ("GET", "/v1/jobs/{job_id}/logs"),
            ("POST", "/v1/sweeps"),  # a sweep's base spec and each trial's are checked as a job's spec is
            ("POST", "/v1/webhooks"),  # an address refused as loopback, private or metadata (server-side request forgery)
            ("PATCH", "/v1/jobs/{job_id}")}  # a priority above the key's max_priority


@dataclass
class LiveApi:
    url: str
    settings: Settings
    admin: str
    alice: str
    bob: str
    job_id: str  # alice's finished job, with metrics, a checkpoint with weights, logs and artifacts
    key_ids: set[str]  # alice's and bob's keys: the run revokes others, never these


@pytest.fixture(scope="module")
def api_live(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[LiveApi]:
    tmp = tmp_path_factory.mktemp("schemathesis-live")
    # PostgreSQL, what a team's install runs on (docker-compose.yml); tests/api/test_schemathesis.py covers SQLite.
    databases = _postgres_database() if POSTGRES else None
    url = next(databases) if databases else f"sqlite:///{tmp / 'torchyard.db'}"
    settings = make_settings(tmp, url, redis_server.url, max_queued_per_owner=20)
    init_db(get_engine(settings.database_url))
    services = Services(settings, tmp / "service-logs")
    # Streams of jobs that never finish (no worker runs here) end within a second, with their reconnect message.
    services.start_api(TORCHYARD_MAX_QUEUED_PER_OWNER="20", TORCHYARD_STREAM_MAX_LIFETIME_S="1", TORCHYARD_SSE_POLL_INTERVAL_S="0.2")
    try:
        with services.client() as admin:
            made = {o: admin.post("/v1/keys", json={"owner": o, "name": o}).json() for o in ("alice", "bob")}
            keys = {o: k["key"] for o, k in made.items()}
            job_id = admin.post("/v1/jobs", headers={"Authorization": f"Bearer {keys['alice']}"}, json={
                "name": "st", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
                "train": {"global_batch_size": 8}}).json()["id"]
        _finished_job(settings, job_id)
        yield LiveApi(services.url, settings, services.headers["Authorization"], f"Bearer {keys['alice']}",
                   f"Bearer {keys['bob']}", job_id, {k["id"] for k in made.values()})
    finally:
        services.stop()
        if databases:
            databases.close()  # drops it


def _finished_job(settings: Settings, job_id: str) -> None:
    run_dir = start_job(settings, job_id)
    ckpt = run_dir / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights" * 100)
    logs = run_dir / "logs" / "attempt-1"
    logs.mkdir(parents=True)
    (logs / "launcher.log").write_text("hello\n")
    (logs / "ranks.log").write_text("[rank 0] hello\n")
    (run_dir / "artifacts").mkdir()
    (run_dir / "artifacts" / "trace.json").write_text('{"traceEvents": []}')
    ingest(settings, job_id, [metric_event(1, 10), {"seq": 2, "time": 2.0, "type": "checkpoint", "step": 10,
                                                    "path": "checkpoints/step_00000010",
                                                    "weights": "checkpoints/step_00000010/model.safetensors"}])
    finish_job(settings, job_id)


@pytest.fixture(scope="module")
def live_schema(api_live: LiveApi) -> schemathesis.BaseSchema:
    # The coverage phase labels some values valid that the schema's patterns refuse (a bare "0" for Last-Event-ID):
    # examples and generated data are checked, the coverage phase is not run.
    config = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}})
    return schemathesis.openapi.from_url(f"{api_live.url}/openapi.json", config=config)


LIVE: dict[str, LiveApi] = {}  # the module's live service, for the checks (they get no fixtures)
SEEN: set[tuple[str, int]] = set()  # (operation, status) of every response checked
STEPS: list[int] = []  # the status of every stateful step


def _owner_of(case: schemathesis.Case) -> str:
    live = LIVE["live"]
    return live.admin if case.path.startswith("/v1/keys") else live.alice


def _spare_our_keys(case: schemathesis.Case) -> None:
    """A revocation the run aims at alice's or bob's key (found in a key listing) revokes a key made for it instead."""
    live = LIVE["live"]
    if case.method == "DELETE" and case.path == "/v1/keys/{key_id}" and (case.path_parameters or {}).get("key_id") in live.key_ids:
        with httpx.Client(base_url=live.url, headers={"Authorization": live.admin}, timeout=30) as admin:
            case.path_parameters["key_id"] = admin.post("/v1/keys", json={"owner": "carol", "name": "spare"}).json()["id"]  # type: ignore[index]


def _auth(case: schemathesis.Case) -> dict[str, str]:
    """The owner's key, unless the case is one sent without a key on purpose (a negative case without Authorization)."""
    headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta is not None else None
    if headers is not None and headers.mode.is_negative and not any(k.lower() == "authorization" for k in case.headers or {}):
        return {}
    return {"Authorization": _owner_of(case)}


@schemathesis.check
def accepted_unless_a_semantic_rule(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """positive_data_acceptance, but where a rule the OpenAPI cannot state refuses the data: a 422 naming a field."""
    if (case.method, case.path) in SEMANTIC and response.status_code == 422:
        problem = response.json()
        assert response.headers.get("content-type", [""])[0] == "application/problem+json" and problem["errors"], problem
        return None
    return positive_data_acceptance(ctx, response, case)


@schemathesis.check
def rejected_unless_lax_scalars(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """negative_data_rejection, but for a spec whose only fault is a scalar of another type that pydantic's lax mode
    converts (false for an integer, 0 for a boolean, "3" for a number): the known defect of jobspec.spec, nothing else."""
    try:
        return negative_data_rejection(ctx, response, case)
    except AcceptedNegativeData as failure:
        lax = case.method == "POST" and case.path in ("/v1/jobs", "/v1/sweeps") and "Incorrect type" in str(failure)
        if lax and isinstance(_at(case.body, str(failure)), (bool, int, float, str)):
            return None
        raise


def _at(body: Any, message: str) -> Any:
    """The value the failure's "in body - a -> b: ..." names, or None."""
    match = re.search(r"in body - (.+?):", message)
    if match is None:
        return None
    for key in match.group(1).split(" -> "):
        if not isinstance(body, dict) or key not in body:
            return None
        body = body[key]
    return body


@schemathesis.check
def nothing_reachable_by_another_owner(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """What answers alice (a job, its files and streams, a code bundle) answers bob with 404, and bob's job list
    never shows a job of hers."""
    SEEN.add((f"{case.method} {case.path}", response.status_code))
    if not 200 <= response.status_code < 300 or _owner_of(case) != LIVE["live"].alice:
        return None
    live = LIVE["live"]
    with httpx.Client(base_url=live.url, headers={"Authorization": live.bob}, timeout=30) as bob:
        if case.method == "POST" and case.path in ("/v1/jobs", "/v1/jobs/{job_id}/retry"):
            job_id = response.json()["id"]
            assert bob.get(f"/v1/jobs/{job_id}").status_code == 404, f"bob reads alice's job {job_id}"
            assert job_id not in {j["id"] for j in bob.get("/v1/jobs", params={"limit": 500}).json()["items"]}
            return None
        if case.path_parameters and ("job_id" in case.path_parameters or "digest" in case.path_parameters):
            kwargs = case.as_transport_kwargs(base_url=live.url)
            headers = {k: v for k, v in (kwargs.get("headers") or {}).items() if k.lower() != "authorization"}
            # Only reads are replayed: a write bob could make would change alice's resource for the checks after this one.
            if case.method == "GET":
                got = bob.request("GET", kwargs["url"], params=kwargs.get("params"), headers={**headers, "Authorization": live.bob})
                assert got.status_code in (404, 422), f"bob got {got.status_code} for alice's {case.formatted_path}"
            job_id = (case.path_parameters or {}).get("job_id")
            if isinstance(job_id, str):
                assert bob.get(f"/v1/jobs/{job_id}").status_code in (404, 422), f"bob reads alice's job {job_id}"
    return None


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, rejected_unless_lax_scalars, accepted_unless_a_semantic_rule, use_after_free,
          ensure_resource_availability, ignored_auth, nothing_reachable_by_another_owner]

schema = schemathesis.pytest.from_fixture("live_schema")


@schema.parametrize()
@hypothesis_settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                     phases=[Phase.explicit, Phase.generate])
def test_every_operation_as_documented(case: schemathesis.Case, api_live: LiveApi) -> None:
    LIVE["live"] = api_live
    job_id = (case.path_parameters or {}).get("job_id")
    # Half the valid generated job ids are alice's real job, so success answers are checked too (not deleted here: the
    # other operations need it; the stateful run deletes what it finds).
    path = case.meta.components.get(ParameterLocation.PATH) if case.meta is not None else None
    if isinstance(job_id, str) and len(job_id) % 2 == 0 and case.method != "DELETE" and (path is None or path.mode.is_positive):
        case.path_parameters["job_id"] = api_live.job_id  # type: ignore[index]
    _spare_our_keys(case)
    case.call_and_validate(headers=_auth(case), checks=CHECKS, timeout=30)


@pytest.fixture(scope="module")
def coverage_schema(api_live: LiveApi) -> schemathesis.BaseSchema:
    config = SchemathesisConfig.from_dict({"phases": {"examples": {"enabled": False}, "fuzzing": {"enabled": False}}})
    return schemathesis.openapi.from_url(f"{api_live.url}/openapi.json", config=config)


@schemathesis.check
def allow_names_every_method_of_the_path(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """A 405 (a method the path does not have) lists in Allow exactly the methods the OpenAPI documents for the path
    (HEAD and OPTIONS aside, which the framework adds); schemathesis itself checks Allow on OPTIONS only."""
    if response.status_code != 405:
        return None
    allowed = {m.strip().upper() for m in ", ".join(response.headers.get("allow", [])).split(",") if m.strip()}
    documented = {m.upper() for m in case.operation.schema[case.operation.path] if m.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE")}
    assert allowed - {"HEAD", "OPTIONS"} == documented, f"Allow: {sorted(allowed)} for a path documenting {sorted(documented)}"
    assert response.headers.get("content-type", [""])[0] == "application/problem+json"
    return None


# The coverage phase: boundary values of every parameter, each required one left out, and the methods an operation does
# not have (405 with a correct Allow). Its "valid" values are not always valid (a bare "0" for Last-Event-ID), so valid
# data acceptance is checked by the generated run above, not here.
COVERAGE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
                   response_schema_conformance, rejected_unless_lax_scalars, missing_required_header, unsupported_method,
                   allow_header_conformance, allow_names_every_method_of_the_path, ignored_auth, nothing_reachable_by_another_owner]
coverage = schemathesis.pytest.from_fixture("coverage_schema")


@coverage.parametrize()
@hypothesis_settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                     phases=[Phase.explicit, Phase.generate])
def test_boundaries_missing_parameters_and_other_methods(case: schemathesis.Case, api_live: LiveApi) -> None:
    LIVE["live"] = api_live
    _spare_our_keys(case)
    case.call_and_validate(headers=_auth(case), checks=COVERAGE_CHECKS, timeout=30)


def test_stateful_sequences_along_the_links(live_schema: schemathesis.BaseSchema, api_live: LiveApi) -> None:
    LIVE["live"] = api_live

    class Machine(live_schema.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: schemathesis.Case) -> None:
            _spare_our_keys(case)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": _auth(case), "timeout": 30}

        def validate_response(self, response: Any, case: schemathesis.Case, additional_checks: Any = None, **kwargs: Any) -> None:
            STEPS.append(response.status_code)
            case.validate_response(response, checks=CHECKS, headers=kwargs.get("headers"), recorder=self.recorder)

    steps_before = len(STEPS)
    try:
        Machine.run(settings=hypothesis_settings(max_examples=STATEFUL_STEPS, deadline=None, derandomize=True,
                                                 suppress_health_check=list(HealthCheck), stateful_step_count=6,
                                                 phases=[Phase.explicit, Phase.generate]))
    except (AssertionError, FlakyStrategyDefinition) as exc:
        # Hypothesis stops exploring when a sequence it replays draws differently, which a live server's new ids can
        # cause (an assertion in its data tree, or a bundle of ids empty on the replay: not a finding). Every step that
        # ran was checked; enough must have run.
        replay = isinstance(exc, FlakyStrategyDefinition) or (
            exc.__traceback__ is not None and "conjecture/datatree.py" in traceback.extract_tb(exc.__traceback__)[-1].filename)
        if not replay:
            raise
        log.warning("the stateful run stopped after %d steps: hypothesis could not replay a sequence", len(STEPS) - steps_before)
        assert len(STEPS) - steps_before >= STATEFUL_STEPS, "the stateful run stopped too early to count"


def test_the_run_reached_real_answers() -> None:
    """The runs above reached alice's resources, not only 404s and 422s: these operations answered 2xx."""
    reached = {label for label, status in SEEN if 200 <= status < 300}
    for label in ("GET /v1/jobs/{job_id}", "GET /v1/jobs/{job_id}/metrics", "GET /v1/jobs/{job_id}/logs",
                  "GET /v1/jobs/{job_id}/artifacts", "GET /v1/jobs", "POST /v1/jobs"):
        assert label in reached, f"{label} never answered 2xx: {sorted(reached)}"
