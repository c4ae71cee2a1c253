"""``torchyard rm``, ``priority`` and ``ls --owner`` against a real API process: finished jobs go and queued ones stay
(the admin's reach covers every owner's, a tenant's only its own), choosing by status asks first; a waiting job's
priority changes within the key's limit; and a job id never reaches another route, whatever it holds."""

from __future__ import annotations

import json

import httpx

from tests.cli.conftest import cli
from tests.helpers import Services
from torchyard.client import Client, NotFound


def submit(services: Services, name: str, headers: dict[str, str] | None = None) -> str:
    with services.client() as http:
        answer = http.post("/v1/jobs", json={"kind": "script", "name": name, "entrypoint": "train.py"}, headers=headers)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def cancelled(services: Services, name: str) -> str:
    job_id = submit(services, name)
    code, out = cli(services, "cancel", job_id)
    assert code == 0 and "cancelled" in out, out  # no worker: a queued job is cancelled at once
    return job_id


def listed(services: Services) -> set[str]:
    code, out = cli(services, "ls", "--all", "--json")
    assert code == 0, out
    return {job["id"] for job in json.loads(out)["items"]}


def test_rm_deletes_finished_jobs_and_refuses_the_rest(services: Services) -> None:
    services.start_api()
    (services.settings.code_dir / "train.py").write_text("pass\n")
    code, out = cli(services, "keys", "create", "--owner", "bob", "--name", "bob's laptop", "--json")
    assert code == 0, out
    bobs_key = json.loads(out)["key"]
    bob = {"Authorization": f"Bearer {bobs_key}"}
    bobs = submit(services, "bobs", bob)

    queued = submit(services, "waiting")
    done = cancelled(services, "done")
    code, out = cli(services, "rm", done, env={"TORCHYARD_API_KEY": bobs_key})
    assert code == 4 and f"job {done} not found" in out, out  # a tenant reaches its own jobs only
    code, out = cli(services, "rm", queued, done, bobs)
    assert code == 4, out  # one refusal is enough to fail the command, but the rest is done
    assert f"deleted {done}" in out and f"{queued}: job {queued} is queued; cancel it first" in out, out
    assert f"{bobs}: job {bobs} is queued; cancel it first" in out, out  # the admin reaches bob's job too
    assert listed(services) == {queued}
    assert httpx.get(f"{services.url}/v1/jobs/{bobs}", headers=bob).json()["status"] == "queued"
    code, out = cli(services, "status", done)
    assert code == 4 and "not found" in out.lower(), out
    code, out = cli(services, "ls", "--owner", "bob")
    assert code == 0 and any(line.split()[:4] == [bobs, "bob", "bobs", "queued"] for line in out.splitlines()), out
    code, out = cli(services, "ls", "--owner", "*", "--json")
    assert code == 0 and [(j["id"], j["owner"]) for j in json.loads(out)["items"]] == [(queued, "admin"), (bobs, "bob")], out

    first, second = cancelled(services, "sweep-a"), cancelled(services, "sweep-b")
    code, out = cli(services, "rm", "--status", "running")
    assert code == 2 and "only finished jobs can be deleted" in out, out
    code, out = cli(services, "rm", "--status", "cancelled")
    assert code == 2 and "this would delete 2 finished jobs" in out and "--yes" in out, out
    assert {first, second} <= listed(services)  # asking deleted nothing
    code, out = cli(services, "rm", "--status", "cancelled", "--name", "sweep-a", "--yes", "--json")
    assert code == 0 and json.loads(out) == {"deleted": [first], "refused": []}, out
    code, out = cli(services, "rm", "--status", "cancelled", "--yes")
    assert code == 0 and f"deleted {second}" in out, out
    assert listed(services) == {queued}
    code, out = cli(services, "rm", "--status", "cancelled", "--yes")
    assert code == 0 and "no finished jobs match" in out, out
    code, out = cli(services, "rm", queued, "--status", "failed")
    assert code == 2 and "not both" in out, out


def test_priority_changes_a_waiting_jobs_priority_within_the_keys_limit(services: Services) -> None:
    services.start_api()
    (services.settings.code_dir / "train.py").write_text("pass\n")
    job_id = submit(services, "waiting")
    code, out = cli(services, "priority", job_id, "90")
    assert code == 0 and f"{job_id}: priority 50 -> 90, queued" in out, out
    code, out = cli(services, "status", job_id, "--json")
    assert code == 0 and json.loads(out)["priority"] == 90, out
    code, out = cli(services, "priority", job_id, "101")
    assert code == 2 and "less than or equal to 100" in out, out  # refused before any request
    code, out = cli(services, "keys", "create", "--owner", "dave", "--name", "ci", "--max-priority", "60", "--json")
    daves = {"TORCHYARD_API_KEY": json.loads(out)["key"]}
    with services.client() as http:
        mine = http.post("/v1/jobs", json={"kind": "script", "name": "d", "entrypoint": "train.py"},
                         headers={"Authorization": f"Bearer {daves['TORCHYARD_API_KEY']}"}).json()["id"]
    code, out = cli(services, "priority", mine, "70", env=daves)
    assert code == 4 and "priority: 70 is above this key's max_priority 60" in out, out
    cli(services, "cancel", job_id)
    code, out = cli(services, "priority", job_id, "10")
    assert code == 4 and "only a queued or running job's priority can change" in out, out


def test_a_job_id_is_one_path_segment(services: Services) -> None:
    """An id taken from elsewhere (a script's argument, a webhook payload) that holds ``../`` must not turn a job call
    into a call on another resource with the caller's key: here, deleting a job into revoking an API key."""
    services.start_api()
    code, out = cli(services, "keys", "create", "--owner", "carol", "--name", "ci", "--json")
    assert code == 0, out
    key = json.loads(out)
    carol = {"Authorization": f"Bearer {key['key']}"}
    admin_key = services.headers["Authorization"].removeprefix("Bearer ")
    with Client(services.url, admin_key) as client:
        for job_id in (f"../keys/{key['id']}", "..", ".", f"x/../../keys/{key['id']}", "%2e%2e"):
            try:
                client.delete_job(job_id)
                raise AssertionError(f"{job_id!r} deleted something")
            except NotFound:
                pass
    code, out = cli(services, "rm", f"../keys/{key['id']}")
    assert code == 4 and "no such path in this API" in out, out  # a slash in an id: no job route has the path
    assert httpx.get(f"{services.url}/v1/jobs", headers=carol).status_code == 200  # carol's key still works
