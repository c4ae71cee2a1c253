"""Where a catalog trial's attempt pauses: read at launch from its sweep's row, so a promotion (which raises the
trial's ``allowed_rung`` before it releases the job) moves the next attempt's stop to the next rung."""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Sweep, SweepTrial
from jobs.sweeps import asha
from jobs.sweeps.spec import SweepSpec
from jobs.sweeps.store import SWEEP_LABEL


def trial_pause(session: Session, job_id: str, labels: dict[str, str], kind: str) -> str | None:
    """``steps:N`` or ``epochs:N`` for an ASHA trial's catalog job allowed up to a rung below the last; else None.
    A script trial pauses when its rung value arrives (the sweep controller's stop request)."""
    sweep_id = labels.get(SWEEP_LABEL)
    if kind != "catalog" or not sweep_id:
        return None
    # By the job's own id, not its labels alone: a label names a trial only where that trial's row names the job.
    row = session.exec(sa.select(SweepTrial.allowed_rung, Sweep.spec)  # type: ignore[call-overload]
                       .join(Sweep, Sweep.id == SweepTrial.sweep_id)  # type: ignore[arg-type]
                       .where(SweepTrial.sweep_id == sweep_id, SweepTrial.job_id == job_id)).first()
    session.commit()
    if row is None:
        return None
    allowed, raw = row
    sweep = SweepSpec.model_validate(raw)
    if sweep.asha is None:
        return None
    at = asha.pause_at(sweep.asha, allowed)
    return None if at is None else f"{sweep.asha.resource}:{at}"
