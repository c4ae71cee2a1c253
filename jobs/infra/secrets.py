"""Job secrets: encrypted at rest with Fernet under ``TORCHYARD_SECRETS_KEY``, decrypted only by the worker.

The values never enter ``jobs.spec``, spec.json, RQ payloads or logs: the API encrypts them into
one ``job_secrets`` row beside the job, responses show the names, and the supervisor decrypts
them into the ranks' environment at launch. Several comma-separated keys rotate: the first
encrypts, any of them decrypts.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import sqlalchemy as sa
from cryptography.fernet import InvalidToken, MultiFernet
from sqlmodel import Session

from jobs.settings import Settings, fernet_from
from jobs.store.models import JobSecret


class SecretsUnavailable(RuntimeError):
    """This process cannot decrypt a job's secrets: no key, or not the key they were stored under."""


def _cipher(settings: Settings) -> MultiFernet:
    if settings.secrets_key is None:
        raise SecretsUnavailable("TORCHYARD_SECRETS_KEY is not set on this process")
    return fernet_from(settings.secrets_key.get_secret_value())


def request_digest(canonical: bytes, settings: Settings) -> str:
    """Digest of a submission that carries secrets: an HMAC under a key derived from the secrets key, so a
    stored digest cannot be used to test guesses of a secret without that key."""
    if settings.secrets_key is None:
        raise SecretsUnavailable("TORCHYARD_SECRETS_KEY is not set on this process")
    first = settings.secrets_key.get_secret_value().split(",")[0].strip()
    key = hashlib.sha256(b"torchyard idempotency\0" + first.encode()).digest()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def store(session: Session, job_id: str, values: dict[str, str], settings: Settings) -> None:
    """Add the encrypted secrets of a new job to the session (committed with the job)."""
    token = _cipher(settings).encrypt(json.dumps(values, separators=(",", ":")).encode()).decode()
    session.add(JobSecret(job_id=job_id, names=sorted(values), token=token))


def copy(session: Session, from_job: str, to_job: str) -> None:
    """A retried job carries its predecessor's secrets: the same token, never decrypted here."""
    row = session.get(JobSecret, from_job)
    if row is not None:
        session.add(JobSecret(job_id=to_job, names=list(row.names), token=row.token))


def names(session: Session, job_ids: list[str]) -> dict[str, list[str]]:
    """Secret names per job (jobs without secrets are absent)."""
    if not job_ids:
        return {}
    rows = session.exec(sa.select(JobSecret.job_id, JobSecret.names).where(JobSecret.job_id.in_(job_ids)))  # type: ignore[call-overload, attr-defined]
    return {job_id: list(found) for job_id, found in rows}


def load(session: Session, job_id: str, settings: Settings) -> dict[str, str]:
    """The job's secrets in clear, for the ranks' environment only; {} when it has none."""
    row = session.get(JobSecret, job_id)
    if row is None:
        return {}
    try:
        return json.loads(_cipher(settings).decrypt(row.token.encode()))
    except InvalidToken:
        raise SecretsUnavailable("the job's secrets were stored under another TORCHYARD_SECRETS_KEY") from None


def seal(text: str, settings: Settings) -> str:
    """Encrypt one string (a webhook's signing secret) under the first key; SecretsUnavailable without a key."""
    return _cipher(settings).encrypt(text.encode()).decode()


def unseal(token: str, settings: Settings) -> str:
    """The string ``seal`` encrypted; SecretsUnavailable without the key it was sealed under."""
    try:
        return _cipher(settings).decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretsUnavailable("stored under another TORCHYARD_SECRETS_KEY") from None
