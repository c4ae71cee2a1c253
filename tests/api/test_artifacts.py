"""/v1/jobs/{id}/artifacts against a live API process: listing, download, owner only, and no path trick
(``..``, absolute, percent-encoded, symlinks out of the directory) reaches a file outside ``artifacts/``."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from typer.testing import CliRunner

from jobs.settings import Settings
from tests.api.conftest import mlp_spec, start_job
from tests.helpers import Services
from torchyard.cli.main import app as cli_app


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def raw_get(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET with the request target sent byte for byte: HTTP clients normalise ``..`` and encodings away."""
    parts = urlsplit(url)
    lines = [f"GET {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_artifacts_list_download_owner_only_and_path_safe(services: Services, settings: Settings, tmp_path: Path) -> None:
    services.start_api()
    with services.client() as admin:
        keys = {o: admin.post("/v1/keys", json={"owner": o, "name": o}).json()["key"] for o in ("alice", "bob")}
    alice = {"Authorization": f"Bearer {keys['alice']}"}
    bob = {"Authorization": f"Bearer {keys['bob']}"}
    with httpx.Client(base_url=services.url, timeout=30) as http:
        job = http.post("/v1/jobs", json=mlp_spec(), headers=alice).json()
        run_dir = start_job(settings, job["id"])
        art = run_dir / "artifacts"
        (art / "tensorboard").mkdir(parents=True)
        (art / "tensorboard" / "events.out.tfevents.1").write_bytes(b"E" * 300)
        (art / "notes.txt").write_text("hello")
        secret = tmp_path / "secret.txt"
        secret.write_text("TOP SECRET")
        (run_dir / "spec_copy.json").write_text("SPEC OUTSIDE ARTIFACTS")
        os.symlink(secret, art / "leak.txt")
        os.symlink(tmp_path, art / "leakdir")
        os.mkfifo(art / "pipe")

        listed = http.get(f"/v1/jobs/{job['id']}/artifacts", headers=alice)
        assert listed.status_code == 200, listed.text
        items = listed.json()["items"]
        assert [(i["path"], i["size_bytes"]) for i in items] == [("notes.txt", 5), ("tensorboard/events.out.tfevents.1", 300)]
        assert listed.json()["truncated"] is False
        got = http.get(f"/v1/jobs/{job['id']}/artifacts/tensorboard/events.out.tfevents.1", headers=alice)
        assert got.status_code == 200 and got.content == b"E" * 300
        assert 'filename="events.out.tfevents.1"' in got.headers["content-disposition"]

        # Another owner's job is a missing job, on both routes.
        for path in ("artifacts", "artifacts/notes.txt"):
            resp = http.get(f"/v1/jobs/{job['id']}/{path}", headers=bob)
            assert resp.status_code == 404 and resp.json()["detail"] == f"job {job['id']} not found"
            assert b"hello" not in resp.content

    base = f"/v1/jobs/{job['id']}/artifacts/"
    tricks = ["../spec_copy.json", "..%2fspec_copy.json", "%2e%2e/spec_copy.json", "%2e%2e%2fspec_copy.json",
              "tensorboard/../../spec_copy.json", "%2Fetc%2Fpasswd", "/etc/passwd", "leak.txt", "leakdir/secret.txt",
              "pipe", "tensorboard", "..%5cspec_copy.json", "notes.txt%00.png", "tensorboard%2F..%2F..%2Fspec_copy.json"]
    for trick in tricks:
        status, body = raw_get(services.url, base + trick, alice)
        assert status == 404, (trick, status, body[:200])
        assert b"TOP SECRET" not in body and b"SPEC OUTSIDE" not in body and b"root:" not in body
    assert raw_get(services.url, base + "notes.txt", alice) == (200, b"hello")  # the raw client itself works

    # The CLI lists and downloads through the same routes.
    env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": keys["alice"]}
    result = CliRunner().invoke(cli_app, ["artifacts", job["id"]], env=env)
    assert result.exit_code == 0 and "tensorboard/events.out.tfevents.1" in result.output and "leak" not in result.output
    out = tmp_path / "dl" / "ev"
    result = CliRunner().invoke(cli_app, ["artifacts", job["id"], "--get", "tensorboard/events.out.tfevents.1", "-o", str(out)], env=env)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == b"E" * 300
    result = CliRunner().invoke(cli_app, ["artifacts", job["id"], "--get", "../spec_copy.json", "-o", str(tmp_path / "x")], env=env)
    assert result.exit_code == 4 and not (tmp_path / "x").exists()
