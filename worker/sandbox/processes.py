"""Owning a job's process tree.

torchrun starts every rank in its own session, and RQ's stop and timeout kill only the
work horse's process group, so signalling a group is not enough. Stopping a job means SIGTERM
to torchrun (it forwards to the ranks, which checkpoint), a grace period, then SIGKILL of every
process of the attempt. Under a job uid (worker/sandbox/job_users.py) that is every process of the uid
and of the attempt's cgroup, which nothing of the job escapes; a worker running jobs as its own
user finds them by the ``TORCHYARD_JOB_ID`` mark in their environment, which a process that
cleans its environment (``setsid env -i``) escapes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from jobspec.pdeathsig import set_parent_death_signal
from worker.sandbox import cgroups
from worker.sandbox.job_users import JobIdentity, end_uid, job_preexec
from worker.sandbox.run_dirs import hand_over, open_job_file

log = logging.getLogger(__name__)

JOB_MARK = "TORCHYARD_JOB_ID"
# Set on a multi-node job's processes: when several nodes share one host (tests, or two workers on
# one machine) stopping one node must not kill another node's ranks.
NODE_MARK = "TORCHYARD_NODE_RANK"
# Set on every process of an attempt (worker/launch.py): a stale supervisor kills its own attempt only.
ATTEMPT_MARK = "TORCHYARD_ATTEMPT"


def _parent_death_signal(parent_pid: int, sig: int) -> Callable[[], None]:
    def preexec() -> None:
        if not set_parent_death_signal(sig):
            return
        # The parent may have died between fork and prctl; then nobody would ever signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def spawn(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path,
          identity: JobIdentity | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, killed if this process dies, output to ``log_path``; as the
    job's uid (in its cgroup) when ``identity`` is given."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec = (_parent_death_signal(os.getpid(), signal.SIGKILL) if identity is None
               else job_preexec(identity, os.getpid(), signal.SIGKILL))
    # The log's directory may be the job's: never through a link a job planted, never onto a FIFO.
    out = os.fdopen(open_job_file(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
    with out:
        return subprocess.Popen(
            cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=preexec,
        )


def marked_processes(job_id: str, node: int | None = None, attempt: int | None = None) -> list[psutil.Process]:
    """Every live process whose environment carries this job's mark (and ``node``'s and ``attempt``'s, when given)."""
    needles = {f"{JOB_MARK}={job_id}".encode()}
    if node is not None:
        needles.add(f"{NODE_MARK}={node}".encode())
    if attempt is not None:
        needles.add(f"{ATTEMPT_MARK}={attempt}".encode())
    found = []
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if needles <= set(f.read().split(b"\0")):
                    found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def kill_marked(job_id: str, timeout_s: float = 15.0, node: int | None = None, attempt: int | None = None) -> int:
    """SIGKILL every process of the job until none is left (a dying torchrun may still be
    starting ranks while we look). Returns how many were killed."""
    killed = 0
    deadline = time.monotonic() + timeout_s
    while procs := marked_processes(job_id, node, attempt):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        killed += len(procs)
        psutil.wait_procs(procs, timeout=2)
        if time.monotonic() > deadline:
            log.error("job %s: processes survived SIGKILL: %s", job_id, [p.pid for p in procs], extra={"job_id": job_id})
            break
    return killed


def end_identity(identity: JobIdentity) -> float:
    """SIGKILL everything of the attempt: its cgroup (where it has one), then every process of its uid, until
    none is left on this host. The seconds from the call to no process left."""
    started = time.monotonic()
    if identity.cgroup is not None:
        cgroups.destroy(identity.cgroup)
    end_uid(identity.uid)
    took = time.monotonic() - started
    if identity.run_dir is not None:
        # Files the job closed to the group (safetensors writes 0600) become the service's to read: weights, logs.
        try:
            hand_over(identity.run_dir, identity.uid, (identity.uid, identity.uid))
        except OSError as exc:
            log.warning("%s: could not open to the service's group: %s", identity.run_dir, exc)
    return took


def kill_attempt(job_id: str, identity: JobIdentity | None, node: int | None = None, attempt: int | None = None) -> None:
    """SIGKILL every process of the attempt: by uid and cgroup when it has them, else by its mark."""
    if identity is None:
        kill_marked(job_id, node=node, attempt=attempt)
        return
    took = end_identity(identity)
    log.info("job %s: no process of uid %d left %.3fs after the kill", job_id, identity.uid, took, extra={"job_id": job_id})


def stop(proc: subprocess.Popen[bytes], job_id: str, grace_s: float, on_wait: Callable[[], None] | None = None,
         node: int | None = None, attempt: int | None = None, identity: JobIdentity | None = None) -> int | None:
    """SIGTERM torchrun, wait up to ``grace_s`` (calling ``on_wait`` meanwhile, e.g. to keep
    ingesting events), then SIGKILL whatever of the job is left. Returns torchrun's exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            if on_wait:
                on_wait()
            time.sleep(0.2)
    kill_attempt(job_id, identity, node=node, attempt=attempt)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None
