"""Jobs that wait for other jobs (``depends_on``): placed once every dependency succeeded; cancelled, with the
error type ``dependency_failed`` naming the dependency, once one of them ended failed or cancelled (or was
deleted), since it can then never run.

``verdict`` is the policy, a pure function; ``unreadable`` checks a submission, ``statuses`` reads for a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Job, Status

ENDED_BADLY = frozenset({Status.FAILED.value, Status.CANCELLED.value})


@dataclass(frozen=True)
class Verdict:
    kind: Literal["ready", "wait", "fail"]
    reason: str = ""
    dependency: str | None = None  # the one that decided a wait or a failure


def verdict(depends_on: Sequence[str], statuses: Mapping[str, str]) -> Verdict:
    """Ready when every dependency succeeded; a failure as soon as one ended failed, cancelled or is gone (the
    first in the spec's order); otherwise wait for the first that has not succeeded yet."""
    for dep in depends_on:
        status = statuses.get(dep)
        if status is None:
            return Verdict("fail", f"dependency job {dep} no longer exists", dep)
        if status in ENDED_BADLY:
            return Verdict("fail", f"dependency job {dep} ended {status}", dep)
    pending = [dep for dep in depends_on if statuses[dep] != Status.SUCCEEDED.value]
    if not pending:
        return Verdict("ready")
    more = f" and {len(pending) - 1} more" if len(pending) > 1 else ""
    return Verdict("wait", f"waiting for job {pending[0]} ({statuses[pending[0]]}){more}", pending[0])


def statuses(session: Session, ids: Iterable[str]) -> dict[str, str]:
    """The status of each of ``ids`` that exists."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = session.exec(sa.select(Job.id, Job.status).where(Job.id.in_(wanted))).all()  # type: ignore[call-overload,attr-defined]
    return dict(rows)


def unreadable(session: Session, owner: str, ids: Iterable[str]) -> list[str]:
    """Those of ``ids`` that do not exist or belong to another owner (indistinguishable to the submitter)."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    found = set(session.exec(sa.select(Job.id).where(Job.id.in_(wanted), Job.owner == owner)).scalars())  # type: ignore[call-overload,attr-defined]
    session.commit()
    return [i for i in wanted if i not in found]
