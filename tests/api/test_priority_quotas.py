"""What a key may ask of the scheduler, and quotas: a priority above the key's max_priority or an unpreemptible job
without the admin's leave is refused by name and creates nothing; quotas are the admin's to set, and a tenant sees
its own."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import ADMIN, mlp_spec


def _key(client: TestClient, owner: str, **fields: object) -> dict[str, str]:
    resp = client.post("/v1/keys", json={"owner": owner, "name": "k", **fields}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    assert resp.json()["max_priority"] == fields.get("max_priority", 50)
    return {"Authorization": f"Bearer {resp.json()['key']}"}


def _fields(resp: object) -> list[str]:
    return [e["field"] for e in resp.json()["errors"]]  # type: ignore[attr-defined]


def _count(client: TestClient, headers: dict[str, str]) -> int:
    return len(client.get("/v1/jobs", headers=headers).json()["items"])


def test_a_key_submits_at_most_at_its_max_priority(client: TestClient) -> None:
    alice = _key(client, "alice", max_priority=60)
    default = _key(client, "bob")
    too_high = client.post("/v1/jobs", json=mlp_spec(priority=70), headers=alice)
    assert too_high.status_code == 422 and _fields(too_high) == ["priority"]
    assert "above this key's max_priority 60" in too_high.json()["errors"][0]["message"]
    assert _count(client, alice) == 0  # nothing was created
    ok = client.post("/v1/jobs", json=mlp_spec(priority=60), headers=alice)
    assert ok.status_code == 201 and ok.json()["priority"] == 60 and ok.json()["preemptible"] is True
    assert client.post("/v1/jobs", json=mlp_spec(), headers=default).json()["priority"] == 50  # the default
    assert client.post("/v1/jobs", json=mlp_spec(priority=51), headers=default).status_code == 422
    out_of_range = client.post("/v1/jobs", json=mlp_spec(priority=101), headers=ADMIN)
    assert out_of_range.status_code == 422 and _fields(out_of_range) == ["priority"]
    assert client.post("/v1/jobs", json=mlp_spec(priority=100), headers=ADMIN).status_code == 201  # the admin's is any
    listed = client.get("/v1/jobs", headers=alice).json()["items"]
    assert [j["priority"] for j in listed] == [60]


def test_only_a_key_with_leave_protects_a_job_from_preemption(client: TestClient) -> None:
    plain = _key(client, "alice")
    protector = _key(client, "carol", may_protect=True)
    refused = client.post("/v1/jobs", json=mlp_spec(preemptible=False), headers=plain)
    assert refused.status_code == 422 and _fields(refused) == ["preemptible"]
    assert _count(client, plain) == 0
    kept = client.post("/v1/jobs", json=mlp_spec(preemptible=False), headers=protector)
    assert kept.status_code == 201 and kept.json()["preemptible"] is False
    not_a_bool = client.post("/v1/jobs", json=mlp_spec(preemptible="no"), headers=protector)
    assert not_a_bool.status_code == 422 and _fields(not_a_bool) == ["preemptible"]


def test_quotas_are_set_by_the_admin_and_each_tenant_sees_its_own(client: TestClient) -> None:
    alice = _key(client, "alice")
    _key(client, "bob")
    assert client.put("/v1/quotas/alice", json={"gpus": 4}, headers=alice).status_code == 403
    bad = client.put("/v1/quotas/alice", json={"gpus": -1}, headers=ADMIN)
    assert bad.status_code == 422 and _fields(bad) == ["gpus"]
    assert client.put("/v1/quotas/alice", json={"gpus": 4, "cpu_slots": 8}, headers=ADMIN).json() == {
        "owner": "alice", "gpus": 4, "cpu_slots": 8, "gpus_used": 0, "cpu_slots_used": 0, "gpus_borrowed": 0}
    assert client.put("/v1/quotas/bob", json={"gpus": 2}, headers=ADMIN).json()["cpu_slots"] is None
    assert [q["owner"] for q in client.get("/v1/quotas", headers=ADMIN).json()["items"]] == ["alice", "bob"]
    assert [q["owner"] for q in client.get("/v1/quotas", headers=alice).json()["items"]] == ["alice"]
    assert client.put("/v1/quotas/admin", json={"gpus": 1}, headers=ADMIN).status_code == 422
    assert client.delete("/v1/quotas/bob", headers=ADMIN).status_code == 204
    assert client.delete("/v1/quotas/bob", headers=ADMIN).status_code == 404
    assert [q["owner"] for q in client.get("/v1/quotas", headers=ADMIN).json()["items"]] == ["alice"]
