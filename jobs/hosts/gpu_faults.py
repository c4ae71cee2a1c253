"""GPUs that fail jobs: which failures are device faults, which GPU a fault counts against, and when it is quarantined.

A failed attempt whose failing rank's output carries one of ``FAULTS`` (or an operator's
``TORCHYARD_GPU_FAULT_PATTERNS``) counts against the GPU that rank ran on: its local rank's device in the
placement, or every GPU the attempt held where the failing rank is not known. ``TORCHYARD_GPU_FAULT_LIMIT``
faults on one GPU without a success between them quarantine it until an admin clears it. The decisions here are
pure; ``record_fault`` and ``record_success`` keep the counts in SQL (host_gpus).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.hosts.states import DEVICE_FAULT, record
from jobs.store.models import Attempt, ErrorType, HostGpu

log = logging.getLogger(__name__)

# What the CUDA runtime, the driver (Xid in the kernel log, echoed by NCCL and PyTorch), NCCL and NVML print when the
# device, not the program, failed.
FAULTS: tuple[str, ...] = (
    r"uncorrectable ECC error",
    r"\bXid\b",
    r"GPU has fallen off the bus",
    r"NCCL.*system error|ncclSystemError",
    r"unspecified launch failure",
    r"GPU is lost",
)


def patterns(extra: str = "") -> list[re.Pattern[str]]:
    """The built-in list and the operator's (``;``-separated regular expressions), compiled case-insensitively."""
    found = [*FAULTS, *(p.strip() for p in extra.split(";") if p.strip())]
    return [re.compile(p, re.IGNORECASE) for p in found]


def device_fault(text: str | None, known: Sequence[re.Pattern[str]]) -> str | None:
    """The first line of ``text`` naming a device fault, or None."""
    for line in (text or "").splitlines():
        if any(p.search(line) for p in known):
            return line.strip()[:500]
    return None


def blamed(placement: Sequence[dict[str, Any]], rank: int | None) -> list[tuple[str, int]]:
    """(host, GPU) the fault counts against: the failing rank's own device where it is known (a GPU job's ranks are
    laid out node by node, one per GPU of the node in order), else every GPU of the attempt."""
    nodes = sorted(placement, key=lambda n: n["node_rank"])
    every = [(n["host"], g) for n in nodes for g in n.get("gpus") or ()]
    if rank is not None and 0 <= rank < len(every):
        return [every[rank]]
    return every


def counted(faults: int, limit: int) -> tuple[int, bool]:
    """One more fault on a GPU with ``faults`` since its last success: (its new count, whether it is quarantined now).
    It is quarantined once, when the count reaches ``limit``."""
    now = faults + 1
    return now, now == limit


def record_fault(session: Session, gpus: Iterable[tuple[str, int]], line: str, limit: int) -> list[tuple[str, int]]:
    """Count one fault against each GPU; quarantine those reaching ``limit``. Returns the GPUs quarantined now."""
    quarantined = []
    for host_id, gpu in gpus:
        row = session.get(HostGpu, (host_id, gpu), with_for_update=True) or HostGpu(host_id=host_id, gpu=gpu, faults=0)
        if row.quarantine_reason is not None:
            continue
        row.faults, now = counted(row.faults, limit)
        if now:
            row.quarantine_reason = f"{row.faults} device faults without a success between them; last: {line}"[:1000]
            record(session, host_id, "quarantine", DEVICE_FAULT, row.quarantine_reason, gpu)
            quarantined.append((host_id, gpu))
            log.warning("host %s GPU %d quarantined: %s", host_id, gpu, row.quarantine_reason)
        session.add(row)
    session.commit()
    return quarantined


def faulted_before(session: Session, job_id: str, attempt: int) -> frozenset[tuple[str, int]]:
    """(host, GPU) of the placements of the job's attempts before ``attempt`` that met a device fault: a job goes back
    in line without spending a retry once per GPU, so a fault that follows the job spends its retries."""
    if attempt <= 1:
        return frozenset()
    rows = session.exec(sa.select(Attempt.placement).where(  # type: ignore[call-overload]
        Attempt.job_id == job_id, Attempt.attempt < attempt, Attempt.error_type == ErrorType.DEVICE_FAULT.value)).all()
    session.commit()
    return frozenset((n["host"], g) for (placement,) in rows for n in placement or [] for g in n.get("gpus") or ())


def record_success(session: Session, gpus: Iterable[tuple[str, int]]) -> None:
    """A success on a GPU wipes its faults (a quarantine stays until cleared)."""
    for host_id, gpu in gpus:
        session.exec(sa.update(HostGpu).where(  # type: ignore[call-overload]
            HostGpu.host_id == host_id, HostGpu.gpu == gpu, HostGpu.quarantine_reason.is_(None), HostGpu.faults > 0)  # type: ignore[union-attr]
            .values(faults=0))
    session.commit()
