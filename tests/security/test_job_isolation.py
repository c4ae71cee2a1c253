"""A job is a uid, tried as an attacker: a live API and two workers (two hosts on one machine) running as the
unprivileged uid 10001, the workers holding only CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN and CAP_FOWNER,
a password-protected redis-server and a SQLite file of the service. Owner B runs a sleeper holding a secret;
owner A runs, at the same time on the other worker, a script that tries to reach B and the service and writes
down what it got. Then a job that leaves detached processes behind, which must not outlive it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from cryptography.fernet import Fernet

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from stack.redis_server import RedisServer
from tests.conftest import make_settings
from tests.helpers import ROOT, Services, interpreter_reach, wait_until
from tests.uid_blocks import uid_block

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="starts services as other users: needs root")]

log = logging.getLogger(__name__)

SERVICE_UID = 10001
CAPS = "+setuid,+setgid,+kill,+chown,+fowner"
AS_SERVICE = ["setpriv", f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups"]
AS_WORKER = [*AS_SERVICE, f"--inh-caps={CAPS}", f"--ambient-caps={CAPS}"]

SLEEPER = '''
import itertools, time
for i in itertools.count():
    print(f"tick {i}", flush=True)
    time.sleep(0.2)
'''

# Every attempt is written down as what it got; the test asserts each one was refused.
ATTACK = r'''
import json, os, socket, sys
victim_dir, runs, db, code, redis_port, secret_digest = sys.argv[1:7]
import hashlib
got = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}

def attempt(name, fn):
    try:
        got[name] = ["allowed", repr(fn())[:200]]
    except OSError as exc:
        got[name] = ["refused", exc.__class__.__name__]

def write(path):
    with open(path, "w") as f:
        f.write("planted")

attempt("list_victim", lambda: os.listdir(victim_dir))
attempt("read_victim_spec", lambda: open(os.path.join(victim_dir, "spec.json")).read())
attempt("read_victim_log", lambda: open(os.path.join(victim_dir, "logs", "attempt-1", "launcher.log")).read())
attempt("list_runs_root", lambda: os.listdir(runs))
attempt("read_database", lambda: open(db, "rb").read(16))
attempt("write_runs_root", lambda: write(os.path.join(runs, "planted")))
attempt("write_bundles", lambda: write(os.path.join(runs, ".bundles", "planted")))
attempt("write_venvs", lambda: write(os.path.join(runs, ".venvs", "planted")))
attempt("write_code_dir", lambda: write(os.path.join(code, "planted.py")))
environs, secret_seen, signalled = [], False, []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    if owner != os.getuid():
        environs.append(pid)
    secret_seen |= any(hashlib.sha256(v.split(b"=", 1)[-1]).hexdigest() == secret_digest for v in data.split(b"\0"))
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            os.kill(int(pid), 0)
            signalled.append(pid)
    except OSError:
        pass
got["foreign_environs_read"], got["victim_secret_seen"], got["foreign_pids_signalled"] = environs, secret_seen, signalled
try:
    with socket.create_connection(("127.0.0.1", int(redis_port)), timeout=5) as s:
        s.sendall(b"*2\r\n$4\r\nKEYS\r\n$1\r\n*\r\n")
        got["redis_reply"] = s.recv(200).decode(errors="replace")
except OSError as exc:
    got["redis_reply"] = f"connect failed: {exc}"
with open("attack.json", "w") as f:
    json.dump(got, f)
from torchyard import report
report.metrics(1, {"train/loss": 0.25})
print("attack done", flush=True)
'''

# Leaves a detached, environment-less grandchild and a double-forked daemon behind, then exits 0.
ESCAPE = r'''
import os, subprocess, sys, time
subprocess.Popen(["setsid", "env", "-i", "sleep", "300"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "301"])
    os._exit(0)
os.wait()
with open("uid.txt", "w") as f:
    f.write(str(os.getuid()))
os.makedirs("artifacts", exist_ok=True)
fd = os.open("artifacts/private.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # as safetensors writes weights
os.write(fd, b"weights")
os.close(fd)
time.sleep(0.5)
'''


@dataclass
class Isolated:
    services: Services
    settings: Settings
    redis_server: RedisServer
    work: Path
    db_file: Path

    def tenant(self, owner: str) -> httpx.Client:
        with self.services.client() as admin:
            resp = admin.post("/v1/keys", json={"owner": owner, "name": f"{owner} key"})
        assert resp.status_code == 201, resp.text
        return httpx.Client(base_url=self.services.url, headers={"Authorization": f"Bearer {resp.json()['key']}"}, timeout=30)


def _traversable(path: Path, restore: list[tuple[Path, int]]) -> None:
    """o+x on ``path`` and its ancestors, so uids other than root reach it (the interpreter may live under /root)."""
    for p in [path, *path.parents]:
        mode = stat.S_IMODE(p.stat().st_mode)
        if not mode & 0o001:
            restore.append((p, mode))
            os.chmod(p, mode | 0o001)


def _own(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, SERVICE_UID, SERVICE_UID)
    os.chmod(path, mode)


@pytest.fixture(scope="module")
def isolated() -> Iterator[Isolated]:
    with interpreter_reach(exclusive=True):  # no local stack reads the interpreter's reach while it is changed here
        yield from _isolated()


def _isolated() -> Iterator[Isolated]:
    restore: list[tuple[Path, int]] = []
    for needed in (Path(os.path.realpath(sys.executable)).parent, Path(sys.prefix), ROOT):
        _traversable(needed, restore)
    # pytest's tmp directories are 0700 root: the service and the jobs could not reach this one.
    work = Path(tempfile.mkdtemp(prefix="torchyard-isolation-"))
    os.chmod(work, 0o755)
    service = work / "service"  # the database file lives here: the service's alone
    _own(service, 0o700)
    redis_server = RedisServer(work / "redis", password=secrets.token_hex(16)).start()
    key = Fernet.generate_key().decode()
    settings = make_settings(work, f"sqlite:///{service / 'torchyard.db'}", redis_server.url, single_user=False,
                             lease_ttl_s=10.0, stop_grace_s=3.0, secrets_key=key)
    # Modes a careless operator left; the workers fix them at start.
    _own(settings.runs_dir, 0o755)
    _own(settings.runs_dir / ".bundles", 0o755)
    _own(settings.runs_dir / ".venvs", 0o777)
    _own(settings.data_dir, 0o755)
    _own(settings.code_dir, 0o755)
    for name, text in (("sleeper.py", SLEEPER), ("attack.py", ATTACK), ("escape.py", ESCAPE)):
        (settings.code_dir / name).write_text(text)
        os.chmod(settings.code_dir / name, 0o644)
    init_db(get_engine(settings.database_url))
    get_engine.cache_clear()
    db_file = service / "torchyard.db"
    for f in service.iterdir():
        os.chown(f, SERVICE_UID, SERVICE_UID)
    logs = work / "logs"
    env = {"TORCHYARD_SINGLE_USER": "false", "TORCHYARD_SECRETS_KEY": key}
    first, last = uid_block()  # this process's own: the teardown kills every process in it
    worker_env = {**env, "TORCHYARD_JOB_UIDS": f"{first}-{last}"}
    api = Services(settings, logs, wrap=AS_SERVICE)
    workers = Services(settings, logs, wrap=AS_WORKER)
    try:
        api.start_api(**env)
        workers.start_worker("host-a", **worker_env)
        workers.start_worker("host-b", **worker_env)
        wait_until(lambda: all("job isolation:" in (logs / f"{n}.log").read_text() for n in ("host-a", "host-b")),
                   60, what="both workers to start")
        yield Isolated(api, settings, redis_server, work, db_file)
    finally:
        workers.stop()
        api.stop()
        redis_server.stop()
        for p, mode in reversed(restore):
            os.chmod(p, mode)
        for proc in psutil.process_iter(["uids"]):
            with contextlib.suppress(psutil.Error):
                if first <= proc.info["uids"].real <= last:
                    proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _submit(client: httpx.Client, spec: dict[str, Any]) -> str:
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def _wait(client: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] in statuses else None

    return wait_until(check, timeout_s, interval_s=0.2, what=f"job {job_id} in {statuses}")


def _live_processes(uid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] is not None and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]


def _uid_of_secret_holder(secret: str) -> int | None:
    needle = secret.encode()
    for proc in psutil.process_iter(["uids"]):
        with contextlib.suppress(OSError, psutil.Error):
            if needle in Path(f"/proc/{proc.pid}/environ").read_bytes():
                return proc.info["uids"].real
    return None


@pytest.fixture(scope="module")
def attack(isolated: Isolated) -> dict[str, Any]:
    """B's sleeper and A's attack running at once (packed on one host or spread on two); what A got, and B's uid and run dir."""
    secret = f"bob-{secrets.token_hex(16)}"
    with isolated.tenant("bob") as bob, isolated.tenant("alice") as alice:
        victim = _submit(bob, {"kind": "script", "name": "victim", "entrypoint": "sleeper.py", "secrets": {"HF_TOKEN": secret}})
        victim_job = _wait(bob, victim, {"running"})
        victim_uid = wait_until(lambda: _uid_of_secret_holder(secret), 60, what="B's rank to hold its secret")
        # A job reads `running` from its placement on; its run directory is named when its worker adopts it.
        victim_job = bob.get(f"/v1/jobs/{victim}").json()
        runs = isolated.settings.runs_dir
        args = [victim_job["run_dir"], str(runs), str(isolated.db_file), str(isolated.settings.code_dir),
                str(isolated.redis_server.port), hashlib.sha256(secret.encode()).hexdigest()]
        attacker = _submit(alice, {"kind": "script", "name": "attacker", "entrypoint": "attack.py", "args": args})
        done = _wait(alice, attacker, {"succeeded", "failed"})
        assert done["status"] == "succeeded", done.get("error")
        # B ran the whole time A attacked it: on the same host as A when the scheduler packed them there (the case
        # that matters most), on the other one otherwise.
        assert _wait(bob, victim, {"running"})["status"] == "running"
        got = json.loads((Path(done["run_dir"]) / "workdir" / "attack.json").read_text())
        # The service still reads what the job wrote, through its group: events into SQL, logs through the API.
        metrics = alice.get(f"/v1/jobs/{attacker}/metrics").json()["items"]
        logs = alice.get(f"/v1/jobs/{attacker}/logs")
        victim_stat = os.stat(victim_job["run_dir"])
        assert bob.post(f"/v1/jobs/{victim}/cancel").status_code == 200
        _wait(bob, victim, {"cancelled"})
        cancelled_left = _live_processes(victim_uid)
    return {"got": got, "victim_uid": victim_uid, "victim_stat": victim_stat, "attacker_dir": done["run_dir"],
            "metrics": metrics, "logs": (logs.status_code, logs.text), "cancelled_left": cancelled_left}


def test_a_job_reaches_neither_another_job_nor_the_service(attack: dict[str, Any]) -> None:
    got = attack["got"]
    refused = ["list_victim", "read_victim_spec", "read_victim_log", "list_runs_root", "read_database", "write_runs_root",
               "write_bundles", "write_venvs", "write_code_dir"]
    assert {name: got[name][0] for name in refused} == dict.fromkeys(refused, "refused"), got
    assert got["victim_secret_seen"] is False
    assert got["foreign_environs_read"] == [] and got["foreign_pids_signalled"] == []
    assert got["redis_reply"].startswith("-NOAUTH"), got["redis_reply"]
    assert got["groups"] == [] and got["gid"] == got["uid"]


def test_each_job_runs_under_its_own_uid_and_owns_its_run_directory(attack: dict[str, Any], isolated: Isolated) -> None:
    attacker_uid, victim_uid = attack["got"]["uid"], attack["victim_uid"]
    first, last = uid_block()
    assert first <= attacker_uid <= last and first <= victim_uid <= last
    assert attacker_uid != victim_uid
    assert attack["cancelled_left"] == []  # a cancelled job left no process behind either
    st_ = attack["victim_stat"]
    assert (st_.st_uid, st_.st_gid, stat.S_IMODE(st_.st_mode)) == (victim_uid, SERVICE_UID, 0o2770)
    runs = isolated.settings.runs_dir
    assert stat.S_IMODE(runs.stat().st_mode) == 0o711
    assert stat.S_IMODE((runs / ".bundles").stat().st_mode) == 0o700
    assert stat.S_IMODE((runs / ".venvs").stat().st_mode) == 0o755
    # What the job wrote stays readable by the service, through the group.
    report = Path(attack["attacker_dir"]) / "workdir" / "attack.json"
    assert report.stat().st_gid == SERVICE_UID and report.stat().st_mode & 0o040
    assert [(m["name"], m["value"]) for m in attack["metrics"]] == [("train/loss", 0.25)], attack["metrics"]
    assert attack["logs"][0] == 200 and "attack done" in attack["logs"][1], attack["logs"]


def test_nothing_outlives_its_attempt(isolated: Isolated) -> None:
    with isolated.tenant("carol") as carol:
        job_id = _submit(carol, {"kind": "script", "name": "escape", "entrypoint": "escape.py"})
        job = _wait(carol, job_id, {"succeeded", "failed"})
        ended = time.monotonic()
        assert job["status"] == "succeeded", job.get("error")
        uid = int((Path(job["run_dir"]) / "workdir" / "uid.txt").read_text())
        assert uid_block()[0] <= uid <= uid_block()[1]

        wait_until(lambda: not _live_processes(uid), 30, interval_s=0.02, what=f"no process of uid {uid}")
        took = time.monotonic() - ended
        def measured_lines() -> list[str]:
            worker_logs = "".join((isolated.work / "logs" / f"{n}.log").read_text() for n in ("host-a", "host-b"))
            return [line for line in worker_logs.splitlines() if f"no process of uid {uid} left" in line]

        # The worker logs the kill's time once its sweep is over, which can come after the processes are gone.
        measured = wait_until(measured_lines, 120, what=f"the worker's 'no process of uid {uid} left' line")
        log.info("uid %d: none of its processes left %.3fs after the job was seen succeeded; worker: %s", uid, took, measured[-1:])
        # A file the job closed to everyone else is the service's to serve once the attempt is over.
        # Its working directory is its uid's, and what it wrote there is served from it as workdir/ artifacts.
        copy = Path(job["run_dir"]) / "workdir"
        assert (copy.stat().st_uid, copy.stat().st_gid) == (uid, SERVICE_UID)
        served = carol.get(f"/v1/jobs/{job_id}/artifacts/workdir/artifacts/private.bin")
        assert (served.status_code, served.content) == (200, b"weights"), served.text
