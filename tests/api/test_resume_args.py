"""resume_args and checkpoint.discover at submission: a malformed template or an escaping glob is a 422
naming the field, and nothing is created."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from jobs.settings import Settings


@pytest.mark.parametrize(("change", "field"), [
    ({"resume_args": ["--ckpt_path", "{ckpt}"]}, "resume_args.1"),
    ({"resume_args": ["--ckpt_path={checkpoint"]}, "resume_args.0"),
    ({"checkpoint": {"discover": ["../other/*.pt"]}}, "checkpoint.discover.0"),
    ({"checkpoint": {"discover": ["/etc/*"]}}, "checkpoint.discover.0"),
])
def test_malformed_resume_args_or_discover_is_422_naming_the_field(client: TestClient, settings: Settings, change: dict,
                                                                    field: str) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    spec = {"kind": "script", "name": "lit", "entrypoint": "train.py", **change}
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert [e["field"] for e in body["errors"]] == [field]
    assert client.get("/v1/jobs").json()["items"] == []


def test_a_well_formed_spec_is_accepted_as_written(client: TestClient, settings: Settings) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    spec = {"kind": "script", "name": "lit", "entrypoint": "train.py", "resume_args": ["--ckpt_path", "{checkpoint}"],
            "checkpoint": {"discover": ["out/*.pt"]}, "env": {"ACCELERATE_MIXED_PRECISION": "no"}}
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["spec"]
    assert stored["resume_args"] == ["--ckpt_path", "{checkpoint}"] and stored["checkpoint"] == {"discover": ["out/*.pt"]}
