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

import httpx
from sqlmodel import Session

from jobs.infra.secrets import SecretsUnavailable
from jobs.scheduling import leader
from jobs.scheduling.lease_loop import LeaseLoop
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.webhooks import post, store
from jobs.webhooks.ssrf import AllowList

log = logging.getLogger(__name__)
LEASE = leader.WEBHOOKS
PRUNE_EVERY = 1000  # steps between removals of old finished deliveries (about 8 minutes at the default period)


class WebhookSender(LeaseLoop):
    def __init__(self, settings: Settings):
        # The lease is renewed a few times per TTL, not every period: an idle install writes almost nothing.
        super().__init__(settings, LEASE, f"{socket.gethostname()}:{os.getpid()}:webhooks",
                         settings.webhook_poll_interval_s, what="webhooks", renew_every_s=settings.lease_ttl_s / 3)
        self.allow = AllowList.parse(settings.webhook_allow_hosts)
        self._steps = 0
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._todo: queue.Queue[store.Due | None] = queue.Queue()
        self._client: httpx.Client | None = None  # made at the first delivery (_http)
        # Daemon threads, not an executor: a POST hanging until its timeout must not hold the process at exit.
        self._posters = [threading.Thread(target=self._post_loop, name=f"torchyard-webhook-post-{i}", daemon=True)
                         for i in range(settings.webhook_threads)]
        for t in self._posters:
            t.start()

    def lead(self, session: Session) -> None:
        # Every write below checks the lease still holds (still_held), so a lapse between renewals costs nothing.
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
            result = post.send(self._http(), hook, delivery, secret, self.settings, self.allow)
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
        super().stop()
        with self._lock:
            if self._client is not None:
                self._client.close()

    def _http(self) -> httpx.Client:
        # Made when the first delivery goes out, not when the API starts: its TLS context loads the CA bundle (about
        # 40 ms of CPU), and an install without webhooks never needs it.
        with self._lock:
            if self._client is None:
                self._client = post.make_client(self.settings)
            return self._client
