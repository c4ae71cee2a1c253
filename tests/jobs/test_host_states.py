"""Host and GPU states against real SQL and Redis: a drain (admin only) keeps new jobs off a host and asks its
running jobs to make room, a quarantined GPU is never placed, both show in GET /v1/hosts and in a waiting job's
reason, and every drain, undrain, quarantine and clear is in the host's history."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from jobs.hosts import gpu_faults
from jobs.hosts import registry as hosts
from jobs.scheduling.reasons import unavailable
from jobs.settings import Settings
from jobs.store.models import Job
from tests.api.conftest import app, client, key_headers, session_of  # noqa: F401 - fixtures
from tests.jobs.test_scheduler_pass import _host, _job, _pass, _submit
from worker import health


def test_a_drained_host_gets_nothing_new_and_its_running_job_is_asked_to_make_room(client: TestClient,  # noqa: F811
                                                                                   settings: Settings) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 2)
    running = _submit(client, 1)
    assert _pass(settings).placed == [running]

    tenant = key_headers(client, "alice")
    assert client.post("/v1/hosts/gpu-a/drain", json={"reason": "new fans"}, headers=tenant).status_code == 403
    assert client.post("/v1/hosts/nope/drain", json={"reason": "x"}).status_code == 404
    assert client.post("/v1/hosts/gpu-a/drain", json={}).status_code == 422
    resp = client.post("/v1/hosts/gpu-a/drain", json={"reason": "new fans"})
    assert resp.status_code == 200, resp.text
    assert (resp.json()["state"], resp.json()["reason"]) == ("draining", "new fans")
    assert _job(settings, running).stop_request == "preempted: host gpu-a is draining: new fans"

    waiting = _submit(client, 1)
    assert _pass(settings).placed == []
    assert _job(settings, waiting).waiting_reason == "no live host serves queue default; host gpu-a drained: new fans"
    _host(settings, "gpu-b", 1)
    other = _submit(client, 1)
    assert _pass(settings).placed == [waiting]
    assert _job(settings, other).waiting_reason.endswith("; host gpu-a drained: new fans")  # type: ignore[union-attr]

    with session_of(settings) as s:  # the job left the host: drained
        s.exec(sa.update(Job).where(Job.id == running).values(status="queued", placement=None))
        s.commit()
    assert client.get("/v1/hosts/gpu-a").json()["state"] == "drained"
    assert client.get("/v1/hosts/gpu-a", headers=tenant).json()["state"] == "drained"  # states are for everyone to read
    assert client.post("/v1/hosts/gpu-a/undrain", headers=tenant).status_code == 403
    assert client.post("/v1/hosts/gpu-a/undrain").json()["state"] == "ready"
    assert [(e["kind"], e["reason"], e["by"]) for e in client.get("/v1/hosts/gpu-a").json()["history"]] == [
        ("drain", "new fans", "admin"), ("undrain", None, "admin")]
    assert client.get("/v1/hosts/nope").status_code == 404


def test_a_quarantined_gpu_is_never_placed_until_cleared(client: TestClient, settings: Settings) -> None:  # noqa: F811
    (settings.code_dir / "train.py").write_text("pass\n")
    _host(settings, "gpu-a", 2)
    with session_of(settings) as s:
        assert gpu_faults.record_fault(s, [("gpu-a", 0)], "uncorrectable ECC error", limit=2) == []
        assert gpu_faults.record_success(s, [("gpu-a", 0)]) is None  # a success in between: counting starts over
        assert gpu_faults.record_fault(s, [("gpu-a", 0)], "uncorrectable ECC error", limit=2) == []
        assert gpu_faults.record_fault(s, [("gpu-a", 0)], "uncorrectable ECC error", limit=2) == [("gpu-a", 0)]
    gpus = client.get("/v1/hosts").json()["items"][0]["gpus"]
    assert [(g["index"], g["state"]) for g in gpus] == [(0, "quarantined"), (1, "ready")]
    assert "uncorrectable ECC error" in gpus[0]["reason"]

    one, two = _submit(client, 1), _submit(client, 1)
    assert _pass(settings).placed == [one]
    assert _job(settings, one).placement[0]["gpus"] == [1]  # type: ignore[index]
    assert _job(settings, two).waiting_reason.endswith("; 1 GPU quarantined on gpu-a")  # type: ignore[union-attr]

    assert client.post("/v1/hosts/gpu-a/gpus/7/clear").status_code == 404
    assert client.post("/v1/hosts/gpu-a/gpus/0/clear", headers=key_headers(client, "bob")).status_code == 403
    cleared = client.post("/v1/hosts/gpu-a/gpus/0/clear").json()
    assert [g["state"] for g in cleared["gpus"]] == ["ready", "ready"]
    assert [(e["kind"], e["gpu"], e["by"]) for e in cleared["history"]] == [("quarantine", 0, "device-fault"), ("clear", 0, "admin")]
    assert _pass(settings).placed == [two]
    assert _job(settings, two).placement[0]["gpus"] == [0]  # type: ignore[index]


# ---------------------------------------------------------------- the pure parts

@given(st.lists(st.booleans(), max_size=30), st.integers(1, 5))
def test_a_gpu_is_quarantined_once_after_limit_faults_without_a_success(events: list[bool], limit: int) -> None:
    """``events``: True a fault, False a success. Quarantined exactly when ``limit`` faults ran in a row, and once."""
    faults, quarantined_at = 0, None
    for i, fault in enumerate(events):
        if quarantined_at is not None:
            break
        if not fault:
            faults = 0
            continue
        faults, now = gpu_faults.counted(faults, limit)
        if now:
            quarantined_at = i
    run = 0
    expected = None
    for i, fault in enumerate(events):
        run = run + 1 if fault else 0
        if run == limit:
            expected = i
            break
    assert quarantined_at == expected


nodes = st.lists(st.integers(0, 7), min_size=0, max_size=4, unique=True)


@given(st.lists(nodes, min_size=1, max_size=3), st.one_of(st.none(), st.integers(-1, 20)))
def test_a_fault_counts_against_the_failing_ranks_gpu_or_every_gpu_of_the_attempt(gpus: list[list[int]], rank: int | None) -> None:
    placement = [{"node_rank": i, "host": f"h{i}", "gpus": g} for i, g in reversed(list(enumerate(gpus)))]
    every = [(f"h{i}", g) for i, node in enumerate(gpus) for g in node]
    blamed = gpu_faults.blamed(placement, rank)
    if rank is not None and 0 <= rank < len(every):
        assert blamed == [every[rank]]  # ranks are laid out node by node, one per GPU
    else:
        assert blamed == every


def test_device_faults_are_found_in_the_failing_ranks_output_and_an_operator_adds_more() -> None:
    known = gpu_faults.patterns("my vendor's fault \\d+")
    for text in ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1",
                 "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.", "CUDA error: unspecified launch failure",
                 "torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled system error (run with NCCL_DEBUG=INFO)",
                 "GPU has fallen off the bus", "MY VENDOR'S FAULT 12"):
        assert gpu_faults.device_fault(f"step 3\n{text}\n", known) == text
    assert gpu_faults.device_fault("CUDA out of memory. Tried to allocate 2 GiB", known) is None
    assert gpu_faults.device_fault("xidx is not a fault", known) is None
    assert gpu_faults.device_fault(None, known) is None


def test_unavailable_names_drained_hosts_and_counts_quarantined_gpus() -> None:
    assert unavailable([], [("gpu-a", 0)]) is None
    assert unavailable([("gpu-b", "bad fan")], [("gpu-a", 2), ("gpu-c", 1)]) == \
        "host gpu-b drained: bad fan; 2 GPUs quarantined on gpu-a; 1 GPU quarantined on gpu-c"


@given(st.one_of(st.none(), st.text(min_size=1, max_size=5)), st.booleans())
def test_a_host_is_drained_only_when_draining_with_nothing_running(reason: str | None, holding: bool) -> None:
    state = hosts.host_state(reason, holding)
    assert state == ("ready" if reason is None else "draining" if holding else "drained")


@given(st.lists(st.booleans(), max_size=20), st.sampled_from([None, "admin"]))
def test_the_health_check_undrains_only_what_it_drained(checks: list[bool], start: str | None) -> None:
    """Over any run of passing (True) and failing checks: a failing check drains a ready host, the next passing one
    undrains it, and an admin's drain is never touched."""
    drained_by = start
    for healthy in checks:
        todo = health.action(healthy, drained_by)
        if start == "admin":
            assert todo is None
        if todo == "drain":
            assert not healthy and drained_by is None
            drained_by = "health-check"
        elif todo == "undrain":
            assert healthy and drained_by == "health-check"
            drained_by = None
        assert drained_by in (start, "health-check", None)
    if checks and start is None:
        assert (drained_by == "health-check") == (not checks[-1])
