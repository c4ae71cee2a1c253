"""This worker's host in SQL: registered at start with the devices it owns, heart-beaten while it runs.

One ``python -m worker`` per host owns every GPU of it and its CPU slots; the scheduler places jobs only on
hosts whose heartbeat is younger than one lease (jobs/hosts/registry.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.hosts import registry as hosts
from jobs.settings import Settings
from jobs.store.db import get_engine
from worker import devices

log = logging.getLogger(__name__)


def inventory(settings: Settings, host_id: str) -> hosts.Inventory:
    """What this host owns, as the worker declares it: GPUs found (or TORCHYARD_WORKER_GPUS), CPU slots."""
    slots = settings.worker_cpu_slots if settings.worker_cpu_slots is not None else (os.cpu_count() or 1)
    return hosts.Inventory(id=host_id, gpus=devices.gpu_indices(settings), cpu_slots=slots,
                           queues=tuple(settings.worker_queues), executor=settings.executor, address=advertised_address(settings))


def advertised_address(settings: Settings) -> str:
    """Where other hosts reach this one: TORCHYARD_WORKER_HOST, else this host name's address."""
    if settings.worker_host:
        return settings.worker_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class HostHeartbeat(threading.Thread):
    """Registers the host, then stamps it seen every third of a lease; a database outage is waited out."""

    def __init__(self, settings: Settings, inv: hosts.Inventory):
        super().__init__(name="torchyard-host-heartbeat", daemon=True)
        self.settings, self.inventory = settings, inv
        self.stopped = threading.Event()
        self.engine = get_engine(settings.database_url)

    def register(self) -> None:
        with Session(self.engine) as session:
            hosts.register(session, self.inventory)
        log.info("host %s registered: GPUs %s, %d CPU slots", self.inventory.id, list(self.inventory.gpus) or "none",
                 self.inventory.cpu_slots)

    def run(self) -> None:
        interval = self.settings.lease_ttl_s / 3
        while not self.stopped.wait(interval):
            try:
                with Session(self.engine) as session:
                    if not hosts.heartbeat(session, self.inventory.id):
                        hosts.register(session, self.inventory)  # the row was removed: say it all again
            except SQLAlchemyError as exc:
                log.warning("host %s: heartbeat failed (%s); trying again", self.inventory.id, exc.__class__.__name__)

    def stop(self) -> None:
        """Stop heart-beating and mark the host gone, so nothing is placed on it any more."""
        self.stopped.set()
        with contextlib.suppress(SQLAlchemyError), Session(self.engine) as session:
            hosts.deregister(session, self.inventory.id)
