"""A private single-host Slurm: munged, slurmctld and slurmd with everything in one directory.

For the tests and benchmarks of the Slurm executor. Debian's ``slurm-wlm`` and ``munge`` packages
(``apt-get install -y slurm-wlm munge``) provide the daemons; nothing of the host's own Slurm or
munge configuration is read or changed: the daemons get their own key, socket, ports, state,
spool and log directories, and every command finds them through ``SLURM_CONF``.

The one node is this host (``CPUs`` of them, memory not tracked); two partitions: ``batch`` (the
default, preemptable: a preempted job's tasks get SIGTERM and ``grace_s`` before they are killed)
and ``urgent`` (a higher priority tier that preempts ``batch``). No accounting (slurmdbd): ``sacct``
answers that accounting is disabled, as on many small clusters.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from stack.redis_server import free_port

log = logging.getLogger(__name__)

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")


def missing() -> str | None:
    """Why a private Slurm cannot start here, or None."""
    absent = [name for name in (*DAEMONS, *COMMANDS) if shutil.which(name) is None
              and not Path("/usr/sbin", name).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install -y slurm-wlm munge"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """Start with start(), end with stop(); ``env`` is the environment every Slurm command needs."""

    def __init__(self, workdir: Path, cpus: int = 2, grace_s: int = 30, kill_wait_s: int = 10):
        self.workdir = workdir
        self.cpus, self.grace_s, self.kill_wait_s = cpus, grace_s, kill_wait_s
        self.node = socket.gethostname().split(".")[0]
        self.conf = workdir / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        result = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 60.0) -> SlurmCluster:
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        for sub in ("munge", "state", "spool", "log"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        munge = self.workdir / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self._spawn("munged", [_binary("munged"), "--foreground", "--force", f"--socket={munge / 'socket'}",
                               f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
                               f"--log-file={munge / 'munged.log'}"])
        self._wait(lambda: (munge / "socket").exists(), timeout_s, "munged did not create its socket")
        self.conf.write_text(self._slurm_conf(), encoding="utf-8")
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.command("scontrol", "ping", check=False).count("UP") > 0, timeout_s, "slurmctld did not answer")
        self._spawn("slurmd", [_binary("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._idle, timeout_s, "the node did not become idle")
        log.info("private Slurm up: node %s, %d CPUs, SLURM_CONF=%s", self.node, self.cpus, self.conf)
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            jobs = self.command("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                self.command("scancel", *jobs, check=False)
                self._wait(lambda: not self.command("squeue", "-h", "-o", "%i", check=False).split(), 60, "jobs did not end")
        for name in reversed(DAEMONS):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ helpers

    def jobs(self) -> list[str]:
        """Job ids squeue lists (pending, running, completing)."""
        return self.command("squeue", "-h", "-o", "%i").split()

    def log_text(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {name}\n" + (self.workdir / "log" / name).read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def _idle(self) -> bool:
        states = self.command("sinfo", "-h", "-N", "-o", "%t", check=False).split()
        return bool(states) and all(s == "idle" for s in states)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = (self.workdir / "log" / f"{name}.out").open("ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        out.close()

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{what} ({', '.join(dead) + ' exited; ' if dead else ''}logs in {self.workdir / 'log'})\n"
                                   f"{self.log_text()}")
            time.sleep(0.2)

    def _slurm_conf(self) -> str:
        user = getpass.getuser()
        w = self.workdir
        return "\n".join([
            "ClusterName=torchyardtest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={w / 'munge' / 'socket'}",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd.pid'}",
            f"SlurmctldLogFile={w / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'log' / 'slurmd.log'}",
            # No cgroups in a container: processes are tracked by their parentage, tasks are not bound.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "ReturnToService=2",
            f"KillWait={self.kill_wait_s}",
            "MinJobAge=300",
            "InactiveLimit=0",
            "Waittime=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1024 State=UNKNOWN",
            f"PartitionName=batch Nodes={self.node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={self.grace_s}",
            f"PartitionName=urgent Nodes={self.node} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            "",
        ])
