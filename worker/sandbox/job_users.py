"""A job is a uid: which uid an attempt runs as, how a child becomes it, and how every process of it ends.

The worker (root, or holding CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN, CAP_FOWNER) runs each attempt's
ranks under a uid of ``TORCHYARD_JOB_UIDS`` leased in SQL (worker/sandbox/uid_leases.py), gid equal to the uid, no
supplementary groups and no capabilities. Ending an attempt kills by uid: a child that became the uid
calls ``kill(-1, SIGKILL)``, which signals exactly the processes of that uid, atomically (a fork bomb
cannot outrun it), whatever session, environment or parent they made for themselves.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from jobs.settings import Settings
from worker.sandbox.drop import drop_to, libc, no_new_privs

log = logging.getLogger(__name__)

# Capability bits (linux/capability.h) a worker needs to run jobs under their own uids.
CAP_CHOWN, CAP_FOWNER, CAP_KILL, CAP_SETGID, CAP_SETUID = 0, 3, 5, 6, 7
NEEDED_CAPS = {"CHOWN": CAP_CHOWN, "FOWNER": CAP_FOWNER, "KILL": CAP_KILL, "SETGID": CAP_SETGID, "SETUID": CAP_SETUID}

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class JobIdentity:
    """Who an attempt's processes are: ``uid`` (gid equal), the cgroup they join first, if any, and the run
    directory handed to them (shared with the service's group again when they are gone)."""

    uid: int
    cgroup: Path | None = None
    run_dir: Path | None = None

    @property
    def gid(self) -> int:
        return self.uid


# ------------------------------------------------------------------ policy (pure)


def pick_uid(uids: tuple[int, int], used: Iterable[int], job_id: str) -> int | None:
    """A uid of the inclusive range ``uids`` not in ``used``, or None when all are taken. The search starts at a
    point spread by the job id, so workers leasing at once rarely pick the same uid."""
    low, high = uids
    taken = {u for u in used if low <= u <= high}
    size = high - low + 1
    if len(taken) >= size:
        return None
    start = int.from_bytes(job_id.encode()[-8:].rjust(8, b"\0"), "big") % size
    for i in range(size):
        uid = low + (start + i) % size
        if uid not in taken:
            return uid
    return None  # unreachable: fewer taken than the range holds


def owner_problem(bound_owner: str | None, owner: str) -> str | None:
    """Why a worker running every job as its own user refuses this owner's job, or None."""
    if bound_owner is None or bound_owner == owner:
        return None
    return ("this worker runs jobs as its own user and already ran jobs of another owner; it runs one owner's jobs "
            "unless TORCHYARD_JOB_UIDS (with a worker that may switch uids) or TORCHYARD_SINGLE_USER=true is set")


# ------------------------------------------------------------------ what this worker may do


def effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def missing_caps(caps: int | None = None) -> list[str]:
    """The capabilities switching uids needs that this process lacks (none for root)."""
    if os.geteuid() == 0:
        return []
    caps = effective_caps() if caps is None else caps
    return [name for name, bit in NEEDED_CAPS.items() if not caps & (1 << bit)]


@dataclass(frozen=True)
class Mode:
    uids: tuple[int, int] | None  # None: jobs run as the worker's own user
    one_owner: bool  # True: the worker refuses jobs of a second owner
    description: str


def isolation_mode(settings: Settings) -> Mode:
    if settings.executor != "local":
        return Mode(None, False, f"the {settings.executor} executor runs jobs as the engine does (TORCHYARD_JOB_UIDS unused)")
    if settings.job_uids is not None:
        missing = missing_caps()
        if not missing:
            low, high = settings.job_uids
            return Mode(settings.job_uids, False, f"each job runs under its own uid from {low}-{high}")
        why = f"TORCHYARD_JOB_UIDS is set but this worker lacks CAP_{', CAP_'.join(missing)}"
    else:
        why = "TORCHYARD_JOB_UIDS is unset"
    if settings.single_user:
        return Mode(None, False, f"jobs run as the worker's own user ({why}); TORCHYARD_SINGLE_USER=true: every owner's jobs")
    return Mode(None, True, f"jobs run as the worker's own user ({why}); only the first owner's jobs run here "
                            "(TORCHYARD_SINGLE_USER=true to run every owner's)")


# ------------------------------------------------------------------ becoming the job's uid (in a forked child)


def job_preexec(identity: JobIdentity, parent_pid: int, death_signal: int) -> Callable[[], None]:
    """The child's last steps before exec. Order matters: the cgroup first (joining needs the worker's rights),
    then the uid, the umask, no new privileges (setuid binaries and file capabilities cannot elevate), and the
    parent-death signal last: the kernel clears it on every credential change."""
    procs = str(identity.cgroup / "cgroup.procs") if identity.cgroup is not None else None

    def preexec() -> None:
        if procs is not None:
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError:
                pass  # killing by uid still ends it; the worker sees the cgroup empty and says so
        drop_to(identity.uid, identity.gid)
        os.umask(0o007)
        no_new_privs()
        if libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_PDEATHSIG")
        if os.getppid() != parent_pid:  # the worker died between fork and prctl: nobody would ever signal us
            os._exit(1)

    return preexec


# ------------------------------------------------------------------ ending every process of a uid


def uid_processes(uid: int) -> list[psutil.Process]:
    """Live (not zombie) processes whose real uid is ``uid``, on this host."""
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        try:
            uids = proc.info["uids"]
            if uids is not None and uids.real == uid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_all_of(uid: int) -> None:
    """``kill -9 -1`` as ``uid``: every process of that uid, atomically, and nothing else."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes system calls and exits
        code = 0
        try:
            drop_to(uid, uid)
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            code = 0  # nothing of that uid was left
        except BaseException:  # noqa: BLE001 - never run on as anything else
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        log.error("could not signal the processes of uid %d (exit %d)", uid, os.waitstatus_to_exitcode(status))


def end_uid(uid: int, timeout_s: float = 10.0) -> float:
    """Kill every process of ``uid`` on this host until psutil sees none; the seconds it took."""
    if uid <= 0 or uid == os.getuid():
        raise ValueError(f"refusing to kill every process of uid {uid}")
    started = time.monotonic()
    while True:
        _kill_all_of(uid)
        left = uid_processes(uid)
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            log.error("processes of uid %d survived SIGKILL: %s", uid, [p.pid for p in left])
            return time.monotonic() - started
        psutil.wait_procs(left, timeout=0.05)
