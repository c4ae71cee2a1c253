"""Real services for tests: the API and workers as processes of their own, running ``python -m api`` and
``python -m worker`` as a user does (the API forked from a process that imported it already: tests/service_forks.py)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from jobs.settings import Settings
from stack.redis_server import free_port
from tests import service_forks

ADMIN_TOKEN = "test-admin-token"
ROOT = Path(__file__).resolve().parent.parent

# The tests' clients speak plain HTTP to 127.0.0.1, but httpx builds a TLS context for every client it makes, loading
# the CA bundle: 40 ms of CPU each, which the readiness polls and the many-client tests paid hundreds of times. They
# share this one instead (``httpx.Client(verify=LOCAL_TLS)``).
LOCAL_TLS = ssl.create_default_context()


def inner_pytest_env() -> dict[str, str]:
    """The environment of a pytest a test runs on its own files: only the plugins it names (every installed one,
    schemathesis's among them, took most of such a run's time), not this run's xdist role, and not the options a
    developer passes this run through PYTEST_ADDOPTS (the inner run has its own conftest, which may not know them)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    return env


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update({
        "TORCHYARD_DATABASE_URL": settings.database_url,
        "TORCHYARD_REDIS_URL": settings.redis_url,
        "TORCHYARD_RUNS_DIR": str(settings.runs_dir),
        "TORCHYARD_DATA_DIR": str(settings.data_dir),
        "TORCHYARD_CODE_DIR": str(settings.code_dir),
        "TORCHYARD_ADMIN_TOKEN": settings.admin_token or ADMIN_TOKEN,
        "TORCHYARD_LEASE_TTL_S": str(settings.lease_ttl_s),
        "TORCHYARD_POLL_INTERVAL_S": str(settings.poll_interval_s),
        "TORCHYARD_STOP_GRACE_S": str(settings.stop_grace_s),
        "TORCHYARD_MAX_NPROC_PER_NODE": str(settings.max_nproc_per_node),
        # A worker owns this many CPU slots whatever the test machine's core count: a 4-rank CPU job fits one worker.
        "TORCHYARD_WORKER_CPU_SLOTS": "4",
        # The service and its client (client/torchyard) from this checkout, whatever an environment's editable installs
        # name: a cached environment's may name a checkout that is gone (tests/worker/test_readme_install_live.py).
        "PYTHONPATH": service_forks.SERVICE_PYTHONPATH,
        "OMP_NUM_THREADS": "1",
        # Jobs of several owners on one worker running them as its own user; tests of job uids set TORCHYARD_JOB_UIDS.
        "TORCHYARD_SINGLE_USER": "true",
    })
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def told_when_called(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> threading.Event:
    """An Event set once ``module.name`` has returned: a test's other thread waits for the code under test to get
    that far, however long a loaded machine takes, instead of sleeping a fixed time."""
    called = threading.Event()
    original = getattr(module, name)

    def call_then_tell(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        called.set()
        return result

    monkeypatch.setattr(module, name, call_then_tell)
    return called


# Attempts of placements that lapsed on a busy machine before their worker adopted ("lost") or started
# ("not_started") them: they run nothing and cost no retry, so a test may find them between the attempts it made.
LAPSED = frozenset({"lost", "not_started"})


def assert_only_lapses_between(outcomes: list[str]) -> None:
    """Between the first attempt and the last, nothing but lapsed placements."""
    assert set(outcomes[1:-1]) <= LAPSED, outcomes


def assert_resumed_after_a_kill(job: dict[str, Any]) -> None:
    """A job whose worker was killed once went on to succeed: its last attempt succeeded, and between the killed
    first and that one there were only lapsed placements (LAPSED)."""
    outcomes = [a["outcome"] for a in job["attempts"]]
    assert len(outcomes) >= 2 and outcomes[-1] == "succeeded", outcomes
    assert_only_lapses_between(outcomes)


def wait_for_api(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float = 60) -> None:
    """Until ``url``/readyz answers 200; fails at once, with the log's tail, if the process exits first."""

    def ready() -> bool:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
            raise AssertionError(f"the api exited with {proc.returncode}:\n{tail}")
        try:
            return http.get(f"{url}/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    with httpx.Client(timeout=2, verify=LOCAL_TLS) as http:
        wait_until(ready, timeout_s, interval_s=0.3, what=f"{url}/readyz")


class Services:
    """An API process and any number of worker processes sharing one Settings."""

    def __init__(self, settings: Settings, logs: Path, wrap: list[str] | None = None, fork: bool = True):
        """``wrap``: a command line every service process starts under (e.g. setpriv to run it as another user).
        ``fork``: False for a process an attacker inspects through /proc, whose ``environ`` must be the service's own
        (a fork's is its parent's, with the service's environment set only in memory)."""
        self.settings, self.logs, self.wrap, self.fork = settings, logs, wrap or [], fork
        self.port = free_port()
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {settings.admin_token or ADMIN_TOKEN}"}

    def _spawn(self, args: list[str], name: str, wrap: list[str] | None = None, **env: str) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        wrap = self.wrap if wrap is None else wrap
        environ = service_env(self.settings, **env)
        # Own sessions, like containers: a signal meant for a worker never reaches pytest. Forked from a process that
        # imported the services already where it can be (tests/service_forks.py), else started as ``python -m``.
        if self.fork and service_forks.usable(args[0], wrap, environ):
            return service_forks.SERVER.spawn(args, environ, ROOT, log)
        # ``wrap`` prefixes the command: setpriv, to run the service as another user.
        with log.open("ab") as out:
            return subprocess.Popen([*wrap, sys.executable, "-m", *args], env=environ, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    # A deadline far past a healthy start (2-5 s): at load 15 an API took over 30 s to answer /readyz. A start that
    # fails still fails at once, with the log's tail (wait_for_api).
    def start_api(self, timeout_s: float = 180, wrap: list[str] | None = None, **env: str) -> Services:
        self.api = self._spawn(["api", "--port", str(self.port), "--log-level", "warning"], "api", wrap, **env)
        wait_for_api(self.api, self.url, self.logs / "api.log", timeout_s)
        return self

    def start_worker(self, name: str | None = None, wrap: list[str] | None = None, **env: str) -> subprocess.Popen[bytes]:
        name = name or f"worker-{len(self.workers)}"
        proc = self._spawn(["worker", "--name", name], name, wrap, **env)
        self.workers.append(proc)
        return proc

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, verify=LOCAL_TLS)

    def wait_status(self, client: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 180) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = client.get(f"/v1/jobs/{job_id}").json()
            return job if job["status"] in statuses else None

        return wait_until(check, timeout_s, interval_s=0.3, what=f"job {job_id} to reach {statuses}")

    def kill_worker(self, worker: subprocess.Popen[bytes], whole: bool = True) -> None:
        """SIGKILL a worker as a crashing container would: its main process and (``whole``) every descendant."""
        victims = tree(worker.pid) if whole else [psutil.Process(worker.pid)]
        for proc in victims:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(victims, timeout=10)
        worker.wait()

    def stop(self) -> None:
        procs = [p for p in [*self.workers, self.api] if p is not None]
        descendants = [d for p in procs if p.poll() is None for d in tree(p.pid)]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(descendants, timeout=20)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)
        for proc in procs:
            proc.wait()


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants, including those in other sessions (torchrun's ranks)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


# Whether other uids can start this interpreter is a property of the machine (pyenv under /root, 0700 by default),
# which tests/security/test_job_isolation.py changes for its module: o+x on /root while its jobs run, the mode back
# after. A local stack started meanwhile (tests/stack/) would take the machine for one where jobs run under uids of
# their own, and lose its interpreter when the mode comes back. The lock keeps the two apart, across processes and
# across copies of the suite on one machine: exclusive while the mode is changed, shared while a test relies on it.
INTERPRETER_REACH_LOCK = Path(tempfile.gettempdir()) / "torchyard-tests-interpreter-reach.lock"


@contextlib.contextmanager
def interpreter_reach(exclusive: bool) -> Iterator[None]:
    with INTERPRETER_REACH_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def session_with_job(settings: Settings, run_dir: Path) -> Iterator[tuple[Any, Any]]:
    """A database session and a new job row whose run directory is ``run_dir``."""
    from sqlmodel import Session

    from jobs.store.db import get_engine
    from jobs.store.models import Job

    with Session(get_engine(settings.database_url), expire_on_commit=False) as session:
        job = Job(owner="admin", name="t", spec={}, run_dir=str(run_dir))
        session.add(job)
        session.commit()
        yield session, job


def plain_db(fn: Callable[[], Any], what: str) -> Any:
    """The supervisor's retrying database wrapper (Lease.db), as a plain call."""
    return fn()
