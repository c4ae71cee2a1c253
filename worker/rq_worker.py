"""The RQ worker registration of a torchyard host (worker/host_runner.py): it pops its host's queue itself, but
registers as an RQ worker, so `rq info`, the local stack and the benchmarks see it."""

from __future__ import annotations

import logging
import os
import socket

import psutil
from rq import Worker

log = logging.getLogger(__name__)


def process_alive(pid: int) -> bool:
    """``pid`` is a running process of this host (a zombie counts as gone: it will never heartbeat again)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


class TorchyardWorker(Worker):
    """A host's registration; the host runner forwards SIGTERM to its tasks itself."""

    def register_birth(self) -> None:
        self.forget_dead_namesake()
        super().register_birth()

    def forget_dead_namesake(self) -> bool:
        """A worker of this name that was killed (SIGKILL, OOM, a crash) leaves its registration until its key
        expires, minutes later, and RQ refuses the name meanwhile. When that worker ran on this host and its
        process is gone, record its death (RQ's own ``register_death``) so a restart under the same name starts
        at once. A namesake alive, or on another host, is left alone: RQ then refuses this one, as it should."""
        old = type(self).find_by_key(self.key, connection=self.connection)
        if old is None or self.connection.hexists(self.key, "death"):
            return False
        if old.hostname != socket.gethostname() or old.pid is None:
            return False
        if old.pid != os.getpid() and process_alive(old.pid):
            return False
        log.warning("worker %s: the previous worker of this name (pid %d) is gone without deregistering; "
                    "recording its death", self.name, old.pid)
        old.register_death()
        return True
