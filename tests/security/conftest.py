"""One live service for the whole package, attacked with tenant keys: an API, a worker serving queue
``default`` and a ``redis-server`` that requires a password (as compose runs it), so every test
here also shows the API, the worker and RQ working with a password-bearing TORCHYARD_REDIS_URL.

The service knows queues ``default`` and ``gpu``; no worker serves ``gpu``, so jobs accepted there
wait and never run. A second API process on the same database and Redis (``short_api``) has no
secrets key and a two-second stream lifetime."""

from __future__ import annotations

import contextlib
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from redis import Redis

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from stack.redis_server import RedisServer
from tests.conftest import make_settings
from tests.helpers import Services

# A rank of a script job that tells what it sees, as files in its run directory, never the secret values themselves.
REPORT_SCRIPT = '''
import ctypes, hashlib, json, os, sys
import sibling
from torchyard import report

with open(f"/proc/{os.getppid()}/environ", "rb") as f:  # torchrun's, which the ranks inherit
    launcher_env = f.read().decode(errors="replace")
libc = ctypes.CDLL("libc.so.6")
sig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
seen = {
    "secret_digests": {k: hashlib.sha256(os.environ[k].encode()).hexdigest() for k in ("WANDB_API_KEY", "HF_TOKEN") if k in os.environ},
    "env": {k: os.environ.get(k) for k in ("APP_MODE", "NCCL_DEBUG")},
    "service_settings": sorted(k for k in os.environ if k.startswith("TORCHYARD_") and k not in (
        "TORCHYARD_JOB_ID", "TORCHYARD_ATTEMPT", "TORCHYARD_RUN_DIR", "TORCHYARD_CODE_DIR", "TORCHYARD_DATA_DIR",
        "TORCHYARD_RESUME_FROM")),
    "sibling": sibling.NAME,
    "run_dir_on_path": os.environ["TORCHYARD_RUN_DIR"] in sys.path or "" in sys.path,
    "cwd": os.getcwd(),
    "pdeathsig": sig.value,
    "launcher_service_settings": sorted({line.split("=")[0] for line in launcher_env.split("\\0")
                                         if line.startswith(("TORCHYARD_DATABASE_URL", "TORCHYARD_ADMIN_TOKEN",
                                                             "TORCHYARD_SECRETS_KEY", "TORCHYARD_REDIS_URL"))}),
}
with open("seen.json", "w") as f:
    json.dump(seen, f)
print("rank", os.environ.get("RANK"), "reporting", file=sys.stderr)
report.metrics(1, {"train/loss": 0.5})
with open("ckpt.bin", "w") as f:
    f.write("weights")
report.checkpoint("ckpt.bin", 1)
'''

# Runs until cancelled, printing a numbered line every 0.2 s.
SLEEPER_SCRIPT = '''
import itertools, sys, time
for i in itertools.count():
    print(f"tick {i}", flush=True)
    time.sleep(0.2)
'''


@dataclass
class Live:
    services: Services
    settings: Settings
    redis_server: RedisServer
    env: dict[str, str]
    work: Path
    _owners: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return self.services.url

    def admin(self) -> httpx.Client:
        return self.services.client()

    def new_key(self, owner: str, queues: list[str] | None = None) -> tuple[str, str]:
        """(key id, secret) of a fresh tenant key, made through the admin API."""
        body: dict[str, Any] = {"owner": owner, "name": f"{owner} attacker"}
        if queues is not None:
            body["queues"] = queues
        with self.admin() as admin:
            resp = admin.post("/v1/keys", json=body)
        assert resp.status_code == 201, resp.text
        return resp.json()["id"], resp.json()["key"]

    def tenant(self, owner: str, queues: list[str] | None = None, url: str | None = None) -> httpx.Client:
        """An HTTP client holding a fresh tenant key for ``owner`` (a new owner per test keeps tests apart)."""
        _, key = self.new_key(owner, queues)
        return httpx.Client(base_url=url or self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def redis(self) -> Redis:
        return Redis.from_url(self.redis_server.url)

    def rq_jobs(self) -> set[bytes]:
        return set(self.redis().scan_iter("rq:job:*"))

    def job_rows(self, owner: str) -> int:
        with get_engine(self.settings.database_url).connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM jobs WHERE owner = :o"), {"o": owner}).scalar_one()

    def redis_contains(self, needle: bytes) -> list[str]:
        """Keys whose value holds ``needle``, raw or zlib-decompressed (RQ compresses job payloads)."""
        r, found = self.redis(), []
        for key in r.scan_iter("*"):
            kind = r.type(key)
            values: list[bytes] = []
            if kind == b"string":
                values = [r.get(key) or b""]
            elif kind == b"hash":
                values = [v for pair in r.hgetall(key).items() for v in pair]
            elif kind == b"list":
                values = r.lrange(key, 0, -1)
            elif kind == b"set":
                values = list(r.smembers(key))
            elif kind == b"zset":
                values = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
            for value in values:
                expanded = [value]
                with contextlib.suppress(zlib.error):
                    expanded.append(zlib.decompress(value))
                if any(needle in v for v in expanded):
                    found.append(key.decode())
        return found


def live_env(settings: Settings) -> dict[str, str]:
    """The settings tests/helpers.service_env does not carry."""
    env = {
        "TORCHYARD_QUEUES": ",".join(settings.queues),
        "TORCHYARD_SCRIPT_MODULES": ",".join(settings.script_modules),
        "TORCHYARD_MAX_STREAMS_PER_OWNER": str(settings.max_streams_per_owner),
        "TORCHYARD_STREAM_MAX_LIFETIME_S": str(settings.stream_max_lifetime_s),
        "TORCHYARD_SSE_POLL_INTERVAL_S": str(settings.sse_poll_interval_s),
    }
    if settings.secrets_key is not None:
        env["TORCHYARD_SECRETS_KEY"] = settings.secrets_key.get_secret_value()
    return env


@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    work = tmp_path_factory.mktemp("security")
    redis_server = RedisServer(work / "redis", password=secrets.token_hex(16)).start()
    settings = make_settings(
        work, f"sqlite:///{work / 'torchyard.db'}", redis_server.url, queues=["default", "gpu"], script_modules=["json.tool"],
        secrets_key=Fernet.generate_key().decode(), max_streams_per_owner=3, sse_poll_interval_s=0.2,
        stream_max_lifetime_s=600.0,
    )
    code = settings.code_dir
    (code / "report.py").write_text(REPORT_SCRIPT)
    (code / "sibling.py").write_text("NAME = 'sibling module'\n")
    (code / "sleeper.py").write_text(SLEEPER_SCRIPT)
    init_db(get_engine(settings.database_url))
    env = live_env(settings)
    # Started as ``python -m``: the attacks read the services' /proc entries (tests/helpers.py, ``fork``).
    services = Services(settings, work / "service-logs", fork=False)
    try:
        services.start_api(**env)
        services.start_worker(**env)
        yield Live(services, settings, redis_server, env, work)
    finally:
        services.stop()
        get_engine.cache_clear()
        redis_server.stop()


@pytest.fixture(scope="package")
def short_api(live: Live) -> Iterator[str]:
    """Another API process on the same database and Redis: no secrets key, streams end after 2 s."""
    env = {**live.env, "TORCHYARD_STREAM_MAX_LIFETIME_S": "2"}
    env.pop("TORCHYARD_SECRETS_KEY")
    other = Services(live.settings, live.work / "short-api-logs", fork=False)
    try:
        other.start_api(**env)
        yield other.url
    finally:
        other.stop()


def assert_refused(client: httpx.Client, live: Live, owner: str, spec: dict[str, Any], field: str) -> dict[str, Any]:
    """POST ``spec``: 422 problem+json naming ``field``, and no job row, no Redis entry made."""
    before = live.rq_jobs()
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 422, (spec, resp.text)
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert field in [e["field"] for e in body["errors"]], (spec, body)
    assert live.job_rows(owner) == 0, spec
    assert live.rq_jobs() - before == set(), spec
    return body
