"""A loop that runs in every process able to lead and acts only while it holds a named lease (jobs/scheduling/leader.py).

The scheduler, the sweep controller and the webhook sender are each one of these: every period each process takes
or renews the lease, the holder does one pass, the others stand by; a clean stop gives the lease up so a standby
takes over at its next period instead of one lease later. A failing pass is logged and the loop goes on, so a
database or Redis outage passes without a restart.
"""

from __future__ import annotations

import abc
import logging
import threading
import time

from sqlmodel import Session

from jobs.scheduling import leader
from jobs.settings import Settings
from jobs.store.db import get_engine

log = logging.getLogger(__name__)


class LeaseLoop(threading.Thread, abc.ABC):
    """Subclasses give ``lead`` (one pass, as the holder) and may change ``wait`` (until the next period)."""

    def __init__(self, settings: Settings, lease: str, holder: str, interval_s: float, *, what: str,
                 renew_every_s: float = 0.0):
        super().__init__(name=f"torchyard-{what}", daemon=True)
        self.settings, self.lease, self.holder, self.interval_s, self.what = settings, lease, holder, interval_s, what
        # 0: the lease is renewed every period. Longer: a few times per TTL, so an idle install writes almost nothing
        # (a holder's writes check it still holds in their own transaction, so a lapse in between costs nothing).
        self.renew_every_s = renew_every_s
        # A standby asks for the lease a few times per TTL, not every period: it cannot be taken before it lapses, and
        # each refused try is an UPDATE, an INSERT that fails and a rollback (8 hosts: 7 standbys writing for nothing
        # several times a second). A released lease (a clean stop) is taken at most this long after.
        self.standby_every_s = max(interval_s, settings.lease_ttl_s / 10)
        self.stopped = threading.Event()
        self.leading = False
        self._renew_at = 0.0

    def run(self) -> None:
        while not self.stopped.is_set():
            self.wait()
            if not self.stopped.is_set():
                self.step()

    def wait(self) -> None:
        self.stopped.wait(self.interval_s)

    def step(self) -> None:
        """Take or renew the lease, and pass if it is ours."""
        if not self.leading and time.monotonic() < self._renew_at:
            return  # a standby between its tries
        try:
            with Session(get_engine(self.settings.database_url), expire_on_commit=False) as session:
                leading = self.leading
                if time.monotonic() >= self._renew_at:
                    leading = leader.hold(session, self.lease, self.holder, self.settings.lease_ttl_s)
                    self._renew_at = time.monotonic() + (self.renew_every_s if leading else self.standby_every_s)
                if leading != self.leading:
                    log.info("%s: %s the %s lease", self.what, "took" if leading else "lost", self.lease)
                    self.leading = leading
                    self.lead_changed()
                if leading:
                    self.lead(session)
        except Exception:  # noqa: BLE001 - the loop must outlive a passing database or Redis outage
            log.exception("%s pass failed", self.what)

    @abc.abstractmethod
    def lead(self, session: Session) -> None:
        """One pass, as the lease's holder."""

    def lead_changed(self) -> None:
        """Called when this process took or lost the lease, before its first pass as the new holder."""

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the loop after the pass in progress (a pass after its process shut its database down would only
        fail), then give the lease up."""
        self.stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)
        if self.leading:
            try:
                with Session(get_engine(self.settings.database_url)) as session:
                    leader.release(session, self.lease, self.holder)
            except Exception:  # noqa: BLE001 - a standby takes over one lease later instead
                log.warning("%s: could not release the %s lease", self.what, self.lease)
