"""A real S3 server for tests: SeaweedFS (stack/seaweed_server.py) on free loopback ports, its data in its own
temporary directory, with one access key and a bucket. It can be stopped and started again on the same ports and
data (the store down for a while)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from stack.seaweed_server import REGION, SeaweedServer, weed

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "SeaweedS3", "weed"]

ACCESS_KEY = "torchyard-test-access"
SECRET_KEY = "torchyard-test-secret-do-not-leak"


class SeaweedS3(SeaweedServer):
    def __init__(self, bucket: str = "torchyard-test") -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="torchyard-s3-")), ACCESS_KEY, SECRET_KEY, bucket)

    @property
    def env(self) -> dict[str, str]:
        """What a process talking to this store needs in its environment (boto3's own variables)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
