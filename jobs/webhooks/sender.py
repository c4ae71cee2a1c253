"""The webhook sender: one process at a time, under the 'webhooks' lease, in the API process.

Each period the leader moves the outbox into deliveries and hands the due ones to a small thread pool, at most
one in flight per webhook: a receiver that hangs holds one thread for the request timeout, never another
webhook's deliveries. A try's result is written only while the lease is still ours; a sender that lost it
leaves the delivery pending for the new leader (at least once: the receiver drops a repeat by its id).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time

from sqlmodel import Session

from jobs import leader
from jobs.db import get_engine
from jobs.secrets import SecretsUnavailable
from jobs.settings import Settings
from jobs.webhooks import post, store
from jobs.webhooks.ssrf import AllowList

log = logging.getLogger(__name__)
LEASE = leader.WEBHOOKS
PRUNE_EVERY = 1000  # steps between removals of old finished deliveries (about 8 minutes at the default period)


class WebhookSender(threading.Thread):
    def __init__(self, settings: Settings):
        super().__init__(name="torchyard-webhooks", daemon=True)
        self.settings = settings
        self.holder = f"{socket.gethostname()}:{os.getpid()}:webhooks"
        self.allow = AllowList.parse(settings.webhook_allow_hosts)
        self.stopped = threading.Event()
        self.leading = False
        self._steps = 0
        self._renew_at = 0.0
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._todo: queue.Queue[store.Due | None] = queue.Queue()
        self._client = post.make_client(settings)
        # Daemon threads, not an executor: a POST hanging until its timeout must not hold the process at exit.
        self._posters = [threading.Thread(target=self._post_loop, name=f"torchyard-webhook-post-{i}", daemon=True)
                         for i in range(settings.webhook_threads)]
        for t in self._posters:
            t.start()

    def run(self) -> None:
        while not self.stopped.wait(self.settings.webhook_poll_interval_s):
            self.step()

    def step(self) -> None:
        try:
            with Session(get_engine(self.settings.database_url), expire_on_commit=False) as session:
                # The lease is renewed a few times per TTL, not every period: an idle install writes almost nothing.
                # Every write below checks it still holds (still_held), so a lapse in between costs nothing.
                if time.monotonic() >= self._renew_at:
                    leading = leader.hold(session, LEASE, self.holder, self.settings.lease_ttl_s)
                    self._renew_at = time.monotonic() + self.settings.lease_ttl_s / 3
                else:
                    leading = self.leading
                if leading != self.leading:
                    log.info("webhooks: %s the sender lease", "took" if leading else "lost")
                    self.leading = leading
                if not leading:
                    return
                self._steps += 1
                taken = store.fan_out(session)
                pruned = store.prune(session) if self._steps % PRUNE_EVERY == 1 else 0
                if (taken or pruned) and leader.still_held(session, LEASE, self.holder, self.settings.lease_ttl_s):
                    session.commit()
                session.rollback()
                with self._lock:
                    free = self.settings.webhook_threads - len(self._busy)
                    found = store.due(session, set(self._busy), free) if free > 0 else []
                    self._busy.update(d.hook.id for d in found)
                session.commit()
            for item in found:
                self._todo.put(item)
        except Exception:  # noqa: BLE001 - the loop must outlive a passing database outage
            log.exception("webhook sender pass failed")

    def _post_loop(self) -> None:
        while (item := self._todo.get()) is not None:
            hook_id = item.hook.id
            try:
                # A webhook that takes its deliveries gets the next one at once, not a poll period later: a burst of
                # events drains at the receiver's pace. One that fails waits for its backoff, holding no thread.
                while item is not None and self._deliver(item) and not self.stopped.is_set():
                    item = self._next(hook_id)
            except Exception:  # noqa: BLE001 - the delivery stays pending and is tried again
                log.exception("webhook %s: a delivery failed; it stays pending", hook_id)
            finally:
                with self._lock:
                    self._busy.discard(hook_id)

    def _next(self, hook_id: str) -> store.Due | None:
        with Session(get_engine(self.settings.database_url), expire_on_commit=False) as session:
            found = store.due(session, set(), 1, webhook_id=hook_id)
            session.commit()
        return found[0] if found else None

    def _deliver(self, item: store.Due) -> bool:
        """One try of one delivery; True when the receiver took it."""
        hook, delivery = item.hook, item.delivery
        try:
            secret = store.secret_of(hook, self.settings)
        except SecretsUnavailable as exc:
            result = post.Result(None, f"cannot sign: {exc}", retry=True)
        else:
            result = post.send(self._client, hook, delivery, secret, self.settings, self.allow)
        with Session(get_engine(self.settings.database_url)) as session:
            if not leader.still_held(session, LEASE, self.holder, self.settings.lease_ttl_s):
                return False  # the new leader sends it again
            state = store.record_try(session, delivery, status=result.status, error=result.error, retry=result.retry,
                                     max_tries=self.settings.webhook_max_tries)
            session.commit()
        if state != "delivered":
            log.warning("webhook %s: delivery %s (%s) try %d: %s; %s", hook.id, delivery.id, delivery.type,
                        delivery.tries + 1, result.error, "retrying later" if state == "pending" else "given up")
        return state == "delivered"

    def stop(self) -> None:
        self.stopped.set()
        for _ in self._posters:
            self._todo.put(None)
        if self.leading:
            try:
                with Session(get_engine(self.settings.database_url)) as session:
                    leader.release(session, LEASE, self.holder)
            except Exception:  # noqa: BLE001 - a standby takes over one lease later instead
                log.warning("webhooks: could not release the sender lease")
        self._client.close()
