from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from jobs.settings import Settings
from tests.helpers import ADMIN_TOKEN


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        yield c


def mlp_spec(**overrides: object) -> dict:
    spec: dict = {
        "name": "mlp-test",
        "model": {"name": "mlp", "args": {"hidden": 16}},
        "data": {"name": "synthetic-classification", "args": {"samples": 256}},
        "parallel": {"strategy": "ddp", "nproc_per_node": 2},
        "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01},
    }
    spec.update(overrides)
    return spec
