"""Placements on real processes: one worker per host owns its GPUs (declared with TORCHYARD_WORKER_GPUS, gloo on the
CPU), runs every job placed on it at once, and each rank sees exactly its job's GPUs through CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from jobs.store.db import get_engine
from jobs.store.models import Lease
from tests.helpers import Services, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}
# Each rank writes what it sees, then waits until ``want`` ranks of the whole test wrote theirs (or a release file):
# a rank that ran alone would time out and fail its job.
SCRIPT = textwrap.dedent("""
    import json, os, pathlib, sys, time
    out, want = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    job, rank = os.environ["TORCHYARD_JOB_ID"], os.environ["RANK"]
    seen = {"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "node": int(os.environ["GROUP_RANK"]),
            "local_rank": int(os.environ["LOCAL_RANK"])}
    with open(out / f"{job}.{rank}.{time.time_ns()}", "w") as f:
        json.dump(seen, f)
    deadline = time.time() + 600  # a safety net: four launches on two loaded cores can start a minute apart
    while len(list(out.glob("*.*.*"))) < want and not (out / "release").exists():
        if time.time() > deadline:
            sys.exit("the other ranks never ran alongside this one")
        time.sleep(0.1)
""")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def out(services: Services) -> Path:
    (services.settings.code_dir / "seen.py").write_text(SCRIPT)
    path = services.settings.runs_dir.parent / "seen"
    path.mkdir()
    return path


def submit(client: httpx.Client, out: Path, gpus: int, want: int, nnodes: int = 1) -> str:
    spec = {"kind": "script", "name": f"gpus-{gpus}", "entrypoint": "seen.py", "args": [str(out), str(want)],
            "parallel": {"nproc_per_node": gpus, "nnodes": nnodes, "device": "cuda"}}
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def seen(out: Path, job_id: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{job_id}.*"))]


def gpus_of(placement: list[dict[str, Any]], node: int = 0) -> str:
    return ",".join(map(str, placement[node]["gpus"]))


def test_four_one_gpu_jobs_run_at_once_each_on_its_own_gpu(services: Services, out: Path) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="4")
    with services.client() as client:
        ids = [submit(client, out, 1, want=4) for _ in range(4)]
        jobs = [services.wait_status(client, i, TERMINAL, timeout_s=120) for i in ids]
        assert [j["status"] for j in jobs] == ["succeeded"] * 4, [j["error"] for j in jobs]
        visible = [seen(out, j["id"])[0]["gpus"] for j in jobs]
        assert sorted(visible) == ["0", "1", "2", "3"]  # disjoint, one GPU each
        assert visible == [gpus_of(j["placement"]) for j in jobs]  # and each the one its placement names
        assert all(j["placement"][0]["host"] == "gpu-box" for j in jobs)


def test_a_three_and_a_one_gpu_job_share_the_host_while_a_two_gpu_job_waits(services: Services, out: Path) -> None:
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="4")
    with services.client() as client:
        # Both run until released: at the same time, on the same host.
        three, one = submit(client, out, 3, want=99), submit(client, out, 1, want=99)
        two = submit(client, out, 2, want=99)
        for job_id in (three, one):
            services.wait_status(client, job_id, {"running"}, timeout_s=60)
        # The first job in line that does not fit holds the host from when the running jobs end at the latest.
        reason = "waiting for 2 GPUs on one host: gpu-box is reserved for it from about "
        waiting = wait_until(lambda: ((d := client.get(f"/v1/jobs/{two}").json())["waiting_reason"] or "").startswith(reason) and d, 60,
                             what="the 2-GPU job's reason")
        assert waiting["status"] == "queued" and waiting["queue_position"] == 0
        queue = client.get("/v1/queue").json()["items"]
        assert [q["id"] for q in queue] == [two] and queue[0]["waiting_reason"].startswith(reason)
        wait_until(lambda: len(list(out.glob("*.*.*"))) == 4, 60, what="the four ranks of the two running jobs")
        (out / "release").touch()
        finished = [services.wait_status(client, i, TERMINAL, timeout_s=120) for i in (three, one, two)]
        assert [j["status"] for j in finished] == ["succeeded"] * 3, [j["error"] for j in finished]
        last = finished[2]
        ranks = {j["id"]: sorted(s["gpus"] for s in seen(out, j["id"])) for j in finished}
        assert ranks[three] == [gpus_of(finished[0]["placement"])] * 3  # every rank sees the job's three GPUs
        assert set(gpus_of(finished[0]["placement"]).split(",")).isdisjoint(gpus_of(finished[1]["placement"]).split(","))
        assert ranks[last["id"]] == [gpus_of(last["placement"])] * 2


def test_two_workers_of_two_gpus_run_a_two_by_two_job(services: Services, out: Path) -> None:
    services.start_api()
    for name in ("gpu-a", "gpu-b"):
        services.start_worker(name, TORCHYARD_WORKER_GPUS="2", TORCHYARD_WORKER_HOST="127.0.0.1",
                              TORCHYARD_GANG_JOIN_TIMEOUT_S="90")
    with services.client() as client:
        job_id = submit(client, out, 2, want=4, nnodes=2)
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
        assert job["status"] == "succeeded", job["error"]
        placement = job["placement"]
        assert sorted((n["host"], n["gpus"]) for n in placement) == [("gpu-a", [0, 1]), ("gpu-b", [0, 1])]
        ranks = seen(out, job_id)
        assert len(ranks) == 4
        assert sorted((r["node"], r["local_rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert {r["gpus"] for r in ranks} == {"0,1"}


def test_the_schedulers_leader_killed_loses_and_doubles_nothing(services: Services, out: Path) -> None:
    services.start_api()
    # A host with nothing to give leads the scheduling; killing it touches no job's processes.
    leader = services.start_worker("leader", TORCHYARD_WORKER_GPUS="0", TORCHYARD_WORKER_CPU_SLOTS="0")
    engine = get_engine(services.settings.database_url)

    def holder() -> str | None:
        with Session(engine) as s:
            lease = s.get(Lease, "scheduler")
            return lease.holder if lease else None

    wait_until(lambda: holder() == "leader", 30, what="the first worker to lead")
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2")
    with services.client() as client:
        (out / "release").touch()  # one job at a time is enough here
        ids = [submit(client, out, 1, want=1) for _ in range(8)]
        wait_until(lambda: any(client.get(f"/v1/jobs/{i}").json()["status"] != "queued" for i in ids), 60,
                   what="the first placement")
        services.kill_worker(leader, whole=True)
        # The standby takes the lease within one lease of the last renewal, and places the rest.
        wait_until(lambda: holder() == "gpu-box", services.settings.lease_ttl_s * 2 + 5, what="the standby to lead")
        jobs = [services.wait_status(client, i, TERMINAL, timeout_s=120) for i in ids]
    assert [j["status"] for j in jobs] == ["succeeded"] * 8
    assert all(len(seen(out, i)) == 1 for i in ids)  # each ran once
    # A placement the dead leader wrote but never handed over lapsed and was placed again: not started, not lost.
    for job in jobs:
        assert [a["outcome"] for a in job["attempts"] if a["outcome"] != "not_started"] == ["succeeded"], job["attempts"]
        assert job["max_attempts"] - job["attempt"] == 0  # no retry spent
