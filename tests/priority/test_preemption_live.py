"""Who goes first, on real processes: a worker declaring 2 GPUs, the scheduler's priorities, quotas and
preemption carried out with the stop every job gets (SIGTERM, a checkpoint within the grace, back in line
without spending a retry), also for a priority raised while waiting, and backfill that never delays the job the
host is reserved for."""

from __future__ import annotations

import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.helpers import Services, wait_until
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}
SECRET = "preemption-test-signing-secret"
# Runs until its release file exists (or ten minutes pass, far past any test's wait); SIGTERM ends it like any job.
HOLD = textwrap.dedent("""
    import os, pathlib, sys, time
    release = pathlib.Path(sys.argv[1]) / os.environ["TORCHYARD_JOB_ID"]
    deadline = time.time() + 600
    while not release.exists() and time.time() < deadline:
        time.sleep(0.1)
""")


def hold_job(client: httpx.Client, gpus: int, **fields: Any) -> str:
    body = {"kind": "script", "name": "hold", "entrypoint": "hold.py", "args": [fields.pop("out")],
            "parallel": {"nproc_per_node": gpus, "device": "cuda"}, **fields}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


@pytest.fixture
def out(services: Services) -> str:
    (services.settings.code_dir / "hold.py").write_text(HOLD)
    path = services.settings.runs_dir.parent / "release"
    path.mkdir()
    return str(path)


def release(out: str, job_id: str) -> None:
    (Path(out) / job_id).touch()


def tenant(client: httpx.Client, owner: str, **fields: Any) -> httpx.Client:
    """A client with a new key of ``owner``: jobs are seen by their owner only."""
    resp = client.post("/v1/keys", json={"owner": owner, "name": "test", **fields})
    assert resp.status_code == 201, resp.text
    return httpx.Client(base_url=client.base_url, headers={"Authorization": f"Bearer {resp.json()['key']}"}, timeout=client.timeout)


def timeline(client: httpx.Client, job_id: str) -> list[tuple[str, str]]:
    return [(t["to_status"], t["reason"]) for t in client.get(f"/v1/jobs/{job_id}").json()["transitions"]]


def test_a_high_priority_job_preempts_a_low_one_that_resumes_from_its_checkpoint(services: Services, settings: Settings) -> None:
    services.start_api(TORCHYARD_SECRETS_KEY=Fernet.generate_key().decode(), TORCHYARD_WEBHOOK_ALLOW_HOSTS="127.0.0.1")
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_PREEMPT_MIN_RUNTIME_S="0",
                          # 0.5 s a step on first attempts: the low job has 16 s left after step 8, far past the
                          # preemption's nudge, stop request and checkpoint on a loaded machine (0.15 s left 4.8 s)
                          **faults(slow(0.5, attempt=1)))
    receiver = Receiver()
    with services.client() as client:
        hook = client.post("/v1/webhooks", json={"url": receiver.url("/"), "events": ["job.preempted"], "secret": SECRET})
        assert hook.status_code == 201, hook.text
        low = client.post("/v1/jobs", json=spec(40, ranks=2, name="low", priority=10)).json()["id"]
        wait_step(services, client, low, 8)
        high = client.post("/v1/jobs", json=spec(10, ranks=2, name="high", priority=80)).json()["id"]
        back = services.wait_status(client, low, {"queued", *TERMINAL}, timeout_s=300)
        assert back["status"] == "queued" and f"preempted by job {high} (priority 80)" in back["waiting_reason"]
        # Webhooks hear of it as job.preempted, once, signed.
        wait_until(lambda: receiver.accepted("/") or None, 60, what="the job.preempted webhook")
        done_high = services.wait_status(client, high, TERMINAL, timeout_s=300)
        assert_nothing_lost(client, done_high, 10)
        done_low = services.wait_status(client, low, TERMINAL, timeout_s=300)
        assert_nothing_lost(client, done_low, 40)  # every step's loss stored exactly once across both attempts
        assert done_low["attempt"] == 2 and done_low["spec"]["retries"] == 0  # no retry was spent
        assert any(to == "queued" and f"preempted by job {high}" in why for to, why in timeline(client, low))
        (got,) = receiver.accepted("/").values()
        receiver.close()
        assert got.signed_by(SECRET) and got.json["type"] == "job.preempted" and got.json["job"]["id"] == low
        assert f"preempted by job {high}" in got.json["job"]["reason"]
        # The high job started before the low one came back.
        assert done_high["started_at"] < next(t["at"] for t in client.get(f"/v1/jobs/{low}").json()["transitions"]
                                              if t["to_status"] == "running" and t["attempt"] == 2)
        assert_usage_is_the_attempts(client, [low, high])
    tries = attempts(settings, low)
    assert [a.outcome for a in tries] == ["preempted", "succeeded"]
    assert tries[1].resumed_from_step is not None and tries[1].resumed_from_step >= 8  # the checkpoint taken on SIGTERM


def assert_usage_is_the_attempts(client: httpx.Client, job_ids: list[str]) -> None:
    """GET /v1/usage gives each attempt's GPUs times its time held, as the job detail shows them."""
    gpu_h = preempted_h = 0.0
    for job_id in job_ids:
        for a in client.get(f"/v1/jobs/{job_id}").json()["attempts"]:
            held = (datetime.fromisoformat(a["finished_at"]) - datetime.fromisoformat(a["started_at"])).total_seconds() / 3600
            gpus = sum(len(n["gpus"]) for n in a["placement"])
            gpu_h += gpus * held
            preempted_h += gpus * held if a["outcome"] == "preempted" else 0
    [row] = client.get("/v1/usage").json()["items"]
    assert row["gpu_hours"] == pytest.approx(gpu_h, abs=1e-5) and row["gpu_hours"] > 0
    assert row["preempted_gpu_hours"] == pytest.approx(preempted_h, abs=1e-5) and preempted_h > 0
    assert (row["jobs"], row["attempts"]) == (2, 3)


def test_an_owner_within_its_quota_takes_back_borrowed_gpus(services: Services, out: str) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_PREEMPT_MIN_RUNTIME_S="0")
    with services.client() as client:
        for owner in ("alice", "bob"):
            assert client.put(f"/v1/quotas/{owner}", json={"gpus": 1}).status_code == 200
        alice, bob = tenant(client, "alice"), tenant(client, "bob")
        # Nobody else wants the GPUs: alice's 2-GPU job borrows one beyond her quota.
        lender = hold_job(alice, 2, out=out)
        running = services.wait_status(alice, lender, {"running"}, timeout_s=300)
        assert running["borrowed"] is True
        use = {q["owner"]: q for q in alice.get("/v1/quotas").json()["items"]}
        assert set(use) == {"alice"} and use["alice"]["gpus_used"] == 2 and use["alice"]["gpus"] == 1
        # Bob asks for what his quota guarantees, at the same priority: the borrowed GPUs come back.
        mine = hold_job(bob, 1, out=out)

        def back_in_line() -> dict[str, Any] | None:
            d = alice.get(f"/v1/jobs/{lender}").json()
            return d if d["status"] in TERMINAL or "owner bob takes back GPUs of its quota" in (d["waiting_reason"] or "") else None

        back = wait_until(back_in_line, 60, what="the lender back in line with its reason")
        assert back["status"] == "queued", back
        services.wait_status(bob, mine, {"running"}, timeout_s=300)
        release(out, mine)
        assert services.wait_status(bob, mine, TERMINAL, timeout_s=300)["status"] == "succeeded"
        # With the GPUs idle again, alice's job runs again and finishes.
        services.wait_status(alice, lender, {"running"}, timeout_s=300)
        release(out, lender)
        done = services.wait_status(alice, lender, TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded" and done["attempt"] == 2


def test_young_and_protected_jobs_are_not_preempted(services: Services, out: str) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_PREEMPT_MIN_RUNTIME_S="4")
    with services.client() as client:
        young = hold_job(client, 1, out=out, priority=10)
        protected = hold_job(client, 1, out=out, priority=10, preemptible=False)
        for job_id in (young, protected):
            services.wait_status(client, job_id, {"running"}, timeout_s=300)
        high = hold_job(client, 1, out=out, priority=90)
        # The preemptible one goes once it has run its minimum; the protected one never.
        stopped = services.wait_status(client, young, {"queued", *TERMINAL}, timeout_s=300)
        assert stopped["status"] == "queued" and f"preempted by job {high}" in stopped["waiting_reason"]
        first = client.get(f"/v1/jobs/{young}").json()
        ran = next(t["at"] for t in first["transitions"] if t["to_status"] == "running")
        stopped_at = next(t["at"] for t in first["transitions"] if t["to_status"] == "queued" and "preempted" in t["reason"])
        assert (datetime.fromisoformat(stopped_at) - datetime.fromisoformat(ran)).total_seconds() >= 4
        services.wait_status(client, high, {"running"}, timeout_s=300)
        assert client.get(f"/v1/jobs/{protected}").json()["status"] == "running"
        assert client.get(f"/v1/jobs/{protected}").json()["attempt"] == 1
        for job_id in (high, protected, young):
            release(out, job_id)
        assert services.wait_status(client, young, TERMINAL, timeout_s=300)["status"] == "succeeded"


def test_raising_a_waiting_jobs_priority_preempts_for_it(services: Services, out: str) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_PREEMPT_MIN_RUNTIME_S="0")
    with services.client() as client:
        first = hold_job(client, 2, out=out, priority=10)
        services.wait_status(client, first, {"running"}, timeout_s=300)
        second = hold_job(client, 2, out=out, priority=10)
        waiting = wait_until(lambda: client.get(f"/v1/jobs/{second}").json()["waiting_reason"], 120, what="a waiting reason")
        assert "preempt" not in waiting and client.get(f"/v1/jobs/{first}").json()["status"] == "running"  # equals wait
        assert client.patch(f"/v1/jobs/{second}", json={"priority": 90}).status_code == 200
        back = services.wait_status(client, first, {"queued", *TERMINAL}, timeout_s=300)
        assert back["status"] == "queued" and f"preempted by job {second} (priority 90)" in back["waiting_reason"]
        services.wait_status(client, second, {"running"}, timeout_s=300)
        release(out, second)
        assert services.wait_status(client, second, TERMINAL, timeout_s=300)["status"] == "succeeded"
        services.wait_status(client, first, {"running"}, timeout_s=300)
        release(out, first)
        done = services.wait_status(client, first, TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded" and done["attempt"] == 2 and done["priority"] == 10


def test_a_backfilled_job_never_delays_the_job_the_host_is_reserved_for(services: Services, out: str) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2")
    with services.client() as client:
        # Its timeout sets when the host is reserved for the head job: far enough off that a busy machine's slow starts
        # cannot reach it before the checks below (the test releases it by hand long before).
        first = hold_job(client, 1, out=out, timeout_s=240)
        services.wait_status(client, first, {"running"}, timeout_s=300)
        head = hold_job(client, 2, out=out)
        # Ends before the head job could start (the first job's timeout): it backfills the idle GPU.
        short = hold_job(client, 1, out=out, timeout_s=5)
        # Could still run when the host frees: it waits behind the head job.
        long = hold_job(client, 1, out=out, timeout_s=3600)
        services.wait_status(client, short, {"running"}, timeout_s=300)
        waiting = wait_until(lambda: ((d := client.get(f"/v1/jobs/{long}").json())["waiting_reason"] or "")
                             .startswith(f"behind job {head}") and d, 30, what="the long job's reason")
        assert waiting["status"] == "queued"
        release(out, short)
        release(out, first)
        services.wait_status(client, head, {"running"}, timeout_s=300)
        assert client.get(f"/v1/jobs/{long}").json()["status"] == "queued"
        release(out, head)
        services.wait_status(client, long, {"running"}, timeout_s=300)
        release(out, long)
        assert services.wait_status(client, long, TERMINAL, timeout_s=300)["status"] == "succeeded"
