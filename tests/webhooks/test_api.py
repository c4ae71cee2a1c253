"""/v1/webhooks: the shapes, the secret shown once, owners kept apart, and addresses refused at creation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from api.app import create_app
from jobs.store.db import get_engine, init_db
from tests.api.conftest import ADMIN, key_headers
from tests.conftest import make_settings


@pytest.fixture
def client(tmp_path: Path, database_url: str, redis_url: str) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, database_url, redis_url, secrets_key=Fernet.generate_key().decode())
    init_db(get_engine(settings.database_url))
    with TestClient(create_app(settings), headers=ADMIN) as c:
        yield c


def test_create_list_deliveries_and_remove(client: TestClient) -> None:
    alice = key_headers(client, "alice")
    resp = client.post("/v1/webhooks", headers=alice, json={"url": "https://hooks.example.com/ty",
                                                             "events": ["job.succeeded", "job.failed"]})
    assert resp.status_code == 201, resp.text
    hook = resp.json()
    assert {"id", "url", "events", "format", "secret"} <= set(hook) and hook["format"] == "json"
    assert len(hook["secret"]) >= 32 and len(hook["id"]) == 24  # an id like a job's
    given = client.post("/v1/webhooks", headers=alice, json={"url": "http://hooks.example.com/s", "events": ["job.failed"],
                                                              "format": "slack", "secret": "my-own-secret-value"}).json()
    assert given["secret"] == "my-own-secret-value" and given["format"] == "slack"

    listed = client.get("/v1/webhooks", headers=alice).json()["items"]
    assert [h["id"] for h in listed] == [hook["id"], given["id"]] and all("secret" not in h for h in listed)
    assert client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=alice).json() == {"items": []}

    bob = key_headers(client, "bob")
    assert client.get("/v1/webhooks", headers=bob).json() == {"items": []}
    for method, path in (("GET", f"/v1/webhooks/{hook['id']}/deliveries"), ("DELETE", f"/v1/webhooks/{hook['id']}")):
        assert client.request(method, path, headers=bob).status_code == 404  # another owner's is a missing one
    assert {h["id"] for h in client.get("/v1/webhooks").json()["items"]} == {hook["id"], given["id"]}  # the admin's view

    assert client.delete(f"/v1/webhooks/{hook['id']}", headers=alice).status_code == 204
    assert [h["id"] for h in client.get("/v1/webhooks", headers=alice).json()["items"]] == [given["id"]]
    assert client.delete(f"/v1/webhooks/{hook['id']}", headers=alice).status_code == 404


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000/hook", "http://10.0.0.5/hook", "http://169.254.169.254/latest/meta-data",
                                 "http://[::1]:8080/hook", "ftp://hooks.example.com/",
                                 "http://^[^\\x00-\\x1f\\x7f]+$"])  # not a URL: was a 500
def test_addresses_of_the_service_neighbourhood_are_refused_naming_url(client: TestClient, url: str) -> None:
    resp = client.post("/v1/webhooks", json={"url": url, "events": ["job.failed"]})
    assert resp.status_code == 422, resp.text
    assert [e["field"] for e in resp.json()["errors"]] == ["url"], resp.json()
    assert client.get("/v1/webhooks").json() == {"items": []}


def test_unknown_events_and_formats_are_refused(client: TestClient) -> None:
    for body in ({"url": "https://h.example.com/", "events": ["job.exploded"]},
                 {"url": "https://h.example.com/", "events": []},
                 {"url": "https://h.example.com/", "events": ["job.failed"], "format": "xml"}):
        assert client.post("/v1/webhooks", json=body).status_code == 422
