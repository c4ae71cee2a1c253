"""The host's health check (TORCHYARD_HOST_HEALTH_CMD), as Slurm's HealthCheckProgram: the worker runs it every
TORCHYARD_HOST_HEALTH_INTERVAL_S; a non-zero exit drains the host with the command's last output line as the
reason, and the first zero exit after that undrains it, unless an admin drained it (the admin undrains that)."""

from __future__ import annotations

import logging
import subprocess
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.hosts import states as host_states
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Host

log = logging.getLogger(__name__)


def action(healthy: bool, drained_by: str | None) -> str | None:
    """What one check does: 'drain' a ready host that failed it, 'undrain' a host it drained once it passes again;
    None otherwise (an admin's drain is the admin's to undo, and a drained host is not drained again)."""
    if not healthy and drained_by is None:
        return "drain"
    if healthy and drained_by == host_states.HEALTH_CHECK:
        return "undrain"
    return None


def run_check(command: str, timeout_s: float) -> tuple[bool, str]:
    """(passed, its last output line). A command that outlives ``timeout_s`` fails."""
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S602 - the operator's own command
    except subprocess.TimeoutExpired:
        return False, f"health check did not finish within {timeout_s:.0f} s"
    except OSError as exc:
        return False, f"health check could not start: {exc}"
    lines = [line.strip() for line in f"{done.stdout}\n{done.stderr}".splitlines() if line.strip()]
    last = lines[-1] if lines else f"exited with code {done.returncode}"
    return done.returncode == 0, last


class HealthCheck(threading.Thread):
    def __init__(self, settings: Settings, host_id: str):
        super().__init__(name="torchyard-host-health", daemon=True)
        self.settings, self.host_id = settings, host_id
        self.stopped = threading.Event()
        self.engine = get_engine(settings.database_url)

    def run(self) -> None:
        interval = self.settings.host_health_interval_s
        while not self.stopped.is_set():
            try:
                self.check_once()
            except SQLAlchemyError as exc:
                log.warning("host %s: health check could not be recorded (%s)", self.host_id, exc.__class__.__name__)
            self.stopped.wait(interval)

    def check_once(self) -> None:
        command = self.settings.host_health_cmd or ""
        healthy, line = run_check(command, max(self.settings.host_health_interval_s, 10.0))
        with Session(self.engine) as session:
            host = session.get(Host, self.host_id)
            drained_by = host.drained_by if host is not None else None
            session.commit()
            todo = action(healthy, drained_by)
            if todo == "drain":
                log.warning("host %s failed its health check: %s", self.host_id, line)
                host_states.drain(session, self.host_id, f"health check failed: {line}", host_states.HEALTH_CHECK)
            elif todo == "undrain":
                log.info("host %s passed its health check again", self.host_id)
                host_states.undrain(session, self.host_id, host_states.HEALTH_CHECK, only_by=host_states.HEALTH_CHECK)

    def stop(self) -> None:
        self.stopped.set()
