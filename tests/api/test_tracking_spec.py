"""The spec's `tracking` and `profile` sections: accepted as given, bad values refused with the field named."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import mlp_spec


def test_tracking_and_profile_are_accepted_and_bad_values_name_the_field(client: TestClient) -> None:
    ok = client.post("/v1/jobs", json=mlp_spec(tracking={"mlflow": {"experiment": "vision/resnet"}},
                                               profile={"start_step": 5, "steps": 2, "memory": True}))
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["tracking"] == {"mlflow": {"experiment": "vision/resnet"}}
    assert ok.json()["spec"]["profile"] == {"start_step": 5, "steps": 2, "memory": True}
    before = len(client.get("/v1/jobs").json()["items"])
    for bad, field in ((mlp_spec(profile={"start_step": 0}), "profile.start_step"),
                       (mlp_spec(profile={"start_step": 1, "steps": 1000}), "profile.steps"),
                       (mlp_spec(profile={"start_step": 1, "trace_dir": "/tmp"}), "profile.trace_dir"),
                       (mlp_spec(tracking={"mlflow": {"experiment": ""}}), "tracking.mlflow.experiment"),
                       (mlp_spec(tracking={"mlflow": {"tracking_uri": "http://evil"}}), "tracking.mlflow.tracking_uri")):
        resp = client.post("/v1/jobs", json=bad)
        assert resp.status_code == 422, (field, resp.text)
        assert field in resp.text, (field, resp.text)
    assert len(client.get("/v1/jobs").json()["items"]) == before  # nothing was created
