"""The outbox and the sender against real SQL and a real HTTP receiver on loopback: events written with the status
change, signed deliveries retried until taken, other owners' events kept apart, refused addresses never posted to,
and a receiver that hangs holding up no other."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from jobs.store.models import Job, Status, utcnow
from jobs.store.states import TransitionRefused, transition
from jobs.webhooks import store
from jobs.webhooks.models import WebhookDelivery, WebhookEvent
from jobs.webhooks.sender import WebhookSender
from tests.conftest import make_settings
from tests.helpers import wait_until
from tests.webhooks.receiver import Receiver

SECRET = "s3cret-for-the-test-0123456789"
log = logging.getLogger(__name__)


@pytest.fixture
def hook_settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    s = make_settings(tmp_path, database_url, redis_url, secrets_key=Fernet.generate_key().decode(),
                      webhook_allow_hosts="127.0.0.1", webhook_poll_interval_s=0.1, webhook_timeout_s=120)
    init_db(get_engine(s.database_url))
    return s


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def sender(hook_settings: Settings) -> Iterator[WebhookSender]:
    s = WebhookSender(hook_settings)
    s.start()
    yield s
    s.stop()


def _session(settings: Settings) -> Session:
    return Session(get_engine(settings.database_url), expire_on_commit=False)


def _job(settings: Settings, owner: str = "alice", name: str = "bert") -> str:
    with _session(settings) as session:
        job = Job(owner=owner, name=name, spec={})
        session.add(job)
        session.commit()
        return job.id


def _run_to(settings: Settings, job_id: str, to: Status) -> None:
    with _session(settings) as session:
        transition(session, job_id, Status.RUNNING, reason="placed")
        transition(session, job_id, to, reason="done", values={"error_message": "boom"} if to is Status.FAILED else None)


def _hook(settings: Settings, owner: str, url: str, events: list[str], fmt: str = "json") -> str:
    with _session(settings) as session:
        row, _ = store.create(session, settings, owner, url, events, fmt, SECRET)
        return row.id


def _deliveries(settings: Settings, hook_id: str) -> list[WebhookDelivery]:
    with _session(settings) as session:
        return list(session.exec(sa.select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id)).scalars())


def test_the_outbox_row_is_written_with_the_change_and_only_then(hook_settings: Settings) -> None:
    job_id = _job(hook_settings)
    with _session(hook_settings) as session:
        transition(session, job_id, Status.RUNNING, reason="placed")
        with pytest.raises(TransitionRefused):
            transition(session, job_id, Status.RUNNING, expect=[Status.QUEUED])
        transition(session, job_id, Status.QUEUED, reason="preempted; resumes from its checkpoint", preempted=True)
        transition(session, job_id, Status.RUNNING, reason="placed")
        transition(session, job_id, Status.QUEUED, reason="attempt 1 failed (crash); retrying")  # a retry: no event
        transition(session, job_id, Status.CANCELLED, reason="cancelled by user")
        rows = session.exec(sa.select(WebhookEvent).order_by(WebhookEvent.id)).scalars().all()
    assert [r.type for r in rows] == ["job.started", "job.preempted", "job.started", "job.cancelled"]
    assert rows[-1].payload["job"]["owner"] == "alice" and rows[-1].payload["job"]["status"] == "cancelled"
    assert rows[1].payload["job"]["reason"].startswith("preempted")


def test_deliveries_are_signed_retried_and_kept_to_their_owner(hook_settings: Settings, receiver: Receiver,
                                                               sender: WebhookSender) -> None:
    receiver.fail_first["/alice"] = 2
    alice = _hook(hook_settings, "alice", receiver.url("/alice"), ["job.failed", "job.succeeded"])
    admin = _hook(hook_settings, "admin", receiver.url("/admin"), ["job.succeeded"])
    slack = _hook(hook_settings, "alice", receiver.url("/slack"), ["job.failed"], fmt="slack")
    mine, theirs = _job(hook_settings, "alice", "bert"), _job(hook_settings, "bob", "gpt")
    _run_to(hook_settings, mine, Status.FAILED)
    _run_to(hook_settings, theirs, Status.SUCCEEDED)

    wait_until(lambda: len(receiver.accepted("/alice")) == 1 and len(receiver.accepted("/admin")) == 1
               and len(receiver.accepted("/slack")) == 1, 60, what="every delivery taken")
    tries = [r for r in receiver.got if r.path == "/alice"]
    assert [r.answered for r in tries] == [500, 500, 200]
    assert len({r.headers["x-torchyard-delivery"] for r in tries}) == 1  # the same id on every try
    assert all(r.signed_by(SECRET) for r in receiver.got)
    got = tries[-1].json
    assert got["type"] == "job.failed" and got["id"] == tries[-1].headers["x-torchyard-delivery"]
    assert got["job"]["id"] == mine and got["job"]["owner"] == "alice" and got["job"]["error"]["message"] == "boom"
    assert tries[-1].headers["x-torchyard-event"] == "job.failed"
    # bob's job reached only the admin's webhook.
    assert [r.json["job"]["id"] for r in receiver.accepted("/admin").values()] == [theirs]
    assert "bert (alice): failed" in next(iter(receiver.accepted("/slack").values())).json["text"]
    # The receiver answered before the sender wrote the result down: wait for that.
    wait_until(lambda: all([d.status for d in _deliveries(hook_settings, h)] == ["delivered"] for h in (alice, admin, slack)),
               60, what="every delivery recorded as delivered")
    (row,) = _deliveries(hook_settings, alice)
    assert (row.status, row.tries, row.last_status) == ("delivered", 3, 200)


def test_a_webhook_hears_nothing_from_before_it_existed(hook_settings: Settings, receiver: Receiver) -> None:
    _run_to(hook_settings, _job(hook_settings), Status.SUCCEEDED)
    hook = _hook(hook_settings, "alice", receiver.url("/late"), ["job.succeeded"])
    with _session(hook_settings) as session:
        assert store.fan_out(session) == 2  # started and succeeded
        session.commit()
    assert _deliveries(hook_settings, hook) == []


def test_a_name_that_resolves_to_loopback_is_refused_at_send(tmp_path: Path, hook_settings: Settings,
                                                             receiver: Receiver) -> None:
    settings = hook_settings.model_copy(update={"webhook_allow_hosts": []})
    sender = WebhookSender(settings)
    sender.start()
    try:
        hook = _hook(settings, "alice", receiver.url("/dns", host="localhost"), ["job.succeeded"])
        _run_to(settings, _job(settings), Status.SUCCEEDED)
        (row,) = wait_until(lambda: [d for d in _deliveries(settings, hook) if d.status == "failed"] or None, 60,
                            what="the delivery refused")
    finally:
        sender.stop()
    assert row.tries == 1 and "loopback" in (row.last_error or "") and "localhost resolves to" in (row.last_error or "")
    assert receiver.got == []


def test_a_receiver_that_never_answers_holds_up_no_other(hook_settings: Settings, receiver: Receiver,
                                                         sender: WebhookSender) -> None:
    receiver.hang.add("/hang")
    _hook(hook_settings, "alice", receiver.url("/hang"), ["job.started", "job.succeeded"])
    _hook(hook_settings, "alice", receiver.url("/ok"), ["job.started", "job.succeeded"])
    first = _job(hook_settings)
    _run_to(hook_settings, first, Status.SUCCEEDED)
    wait_until(lambda: any(r.path == "/hang" for r in receiver.got), 60, what="the hanging receiver to be called")
    second = _job(hook_settings)
    _run_to(hook_settings, second, Status.SUCCEEDED)
    # The hanging request is still open (its timeout is two minutes), and the other receiver got all four events.
    wait_until(lambda: len(receiver.accepted("/ok")) == 4, 60, what="the healthy receiver's four events")
    assert [r.path for r in receiver.got].count("/hang") == 1 and not receiver.released.is_set()
    ok = receiver.accepted("/ok").values()
    delays = [r.at - datetime.fromisoformat(r.json["at"].replace("Z", "+00:00")).timestamp() for r in ok]
    log.warning("beside a receiver that never answers, the other's event-to-receipt delays: %s s (poll %.1f s)",
                ", ".join(f"{d:.3f}" for d in sorted(delays)), hook_settings.webhook_poll_interval_s)
    events = sorted((r.json["job"]["id"], r.json["type"]) for r in ok)
    assert events == sorted([(first, "job.started"), (first, "job.succeeded"), (second, "job.started"),
                             (second, "job.succeeded")])


def test_finished_deliveries_are_kept_a_week_and_pending_ones_until_sent(hook_settings: Settings) -> None:
    hook = _hook(hook_settings, "alice", "https://hooks.example.com/", ["job.failed"])
    long_ago = utcnow() - timedelta(days=store.KEPT_DAYS + 1)
    with _session(hook_settings) as session:
        for i, (state, when) in enumerate([("delivered", long_ago), ("failed", long_ago), ("pending", long_ago),
                                           ("delivered", utcnow())]):
            session.add(WebhookDelivery(id=f"d{i}", webhook_id=hook, type="job.failed", at=when, status=state, next_at=when))
        session.commit()
        assert store.prune(session) == 2
        session.commit()
    assert sorted(d.id for d in _deliveries(hook_settings, hook)) == ["d2", "d3"]


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(utcnow() - timedelta(days=1)).not_valid_after(utcnow() + timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_a_name_is_resolved_once_and_the_request_still_names_it(tmp_path: Path, hook_settings: Settings,
                                                                receiver: Receiver) -> None:
    """The connection goes to the address that was checked; the Host header (http) and the TLS server name
    (https) are still the URL's name, and a certificate the system does not trust is refused."""
    settings = hook_settings.model_copy(update={"webhook_allow_hosts": ["localhost"]})
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[assignment, misc]
    tls = socket.create_server(("127.0.0.1", 0))

    def serve_tls() -> None:
        conn, _ = tls.accept()
        with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
            pass

    threading.Thread(target=serve_tls, daemon=True).start()
    plain = _hook(settings, "alice", receiver.url("/named", host="localhost"), ["job.succeeded"])
    secure = _hook(settings, "alice", f"https://localhost:{tls.getsockname()[1]}/hook", ["job.succeeded"])
    sender = WebhookSender(settings)
    sender.start()
    try:
        _run_to(settings, _job(settings), Status.SUCCEEDED)
        wait_until(lambda: [d.status for d in _deliveries(settings, plain)] == ["delivered"], 60, what="the http delivery")
        (failed,) = wait_until(lambda: [d for d in _deliveries(settings, secure) if d.tries >= 1] or None, 60,
                               what="the https try")
    finally:
        sender.stop()
        tls.close()
    (got,) = receiver.accepted("/named").values()
    assert got.headers["host"] == f"localhost:{receiver.port}"
    assert names == ["localhost"] and failed.status == "pending" and "connection error" in (failed.last_error or "")


def test_a_redirect_is_not_followed(hook_settings: Settings, receiver: Receiver, sender: WebhookSender) -> None:
    receiver.redirect["/moved"] = receiver.url("/elsewhere")
    hook = _hook(hook_settings, "alice", receiver.url("/moved"), ["job.succeeded"])
    _run_to(hook_settings, _job(hook_settings), Status.SUCCEEDED)
    (row,) = wait_until(lambda: [d for d in _deliveries(hook_settings, hook) if d.status == "failed"] or None, 60,
                        what="the delivery to end")
    assert (row.tries, row.last_status) == (1, 302) and "redirect" in (row.last_error or "")
    assert [r.path for r in receiver.got] == ["/moved"]


def test_a_drain_and_a_quarantine_reach_the_admin_s_webhooks_only(hook_settings: Settings) -> None:
    from jobs.hosts import registry as hosts
    from jobs.hosts.states import drain, record

    admin = _hook(hook_settings, "admin", "https://hooks.example.com/ops", ["host.drained", "gpu.quarantined"])
    tenant = _hook(hook_settings, "alice", "https://hooks.example.com/alice", ["host.drained", "gpu.quarantined"])
    with _session(hook_settings) as session:
        hosts.register(session, hosts.Inventory(id="gpu-a", gpus=(0, 1), cpu_slots=2, queues=("default",)))
        assert drain(session, "gpu-a", "swap the PSU", "admin") == []
        record(session, "gpu-a", "quarantine", "device-fault", "2 device faults: uncorrectable ECC error", gpu=1)
        record(session, "gpu-a", "undrain", "admin")  # not sent
        session.commit()
        store.fan_out(session)
        session.commit()
    sent = sorted((d.type, d.payload["host"]["gpu"], d.payload["host"]["reason"]) for d in _deliveries(hook_settings, admin))
    assert sent == [("gpu.quarantined", 1, "2 device faults: uncorrectable ECC error"), ("host.drained", None, "swap the PSU")]
    assert _deliveries(hook_settings, tenant) == []
