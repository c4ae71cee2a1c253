"""Report metrics and checkpoints from your own training script to torchyard.

    from torchyard import report

    start = report.resume_path()                  # None on a fresh run; the latest reported checkpoint on a retry
    ...
    report.metrics(step, loss=loss.item())        # or report.metrics(step, {"train/loss": loss.item()})
    torch.save(state, "snapshot.pt")
    report.checkpoint("snapshot.pt", step)

Under torchyard the worker sets ``TORCHYARD_RUN_DIR``; global rank 0 appends to the run's
``events.jsonl``, the same file and format the catalog trainer writes, and the worker ingests it
into the job's metrics and checkpoints. On every other rank, and whenever the script runs
outside torchyard (by hand, under plain torchrun, in a notebook), metrics() and checkpoint() do
nothing, so one script serves both. Importing this module does not import torch.
"""

from __future__ import annotations

import atexit
import json
import logging
import numbers
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchyard import sinks
from torchyard.events import EVENTS_FILE, EventWriter

log = logging.getLogger(__name__)

RUN_DIR_ENV = "TORCHYARD_RUN_DIR"  # set by the worker (worker/launch.py) for every rank
# Set by the worker for a job started by POST /v1/jobs/{id}/retry: the old job's latest checkpoint.
RESUME_FROM_ENV = "TORCHYARD_RESUME_FROM"

_RESERVED = frozenset({"seq", "time", "type", "step", "epoch", "path"})  # the event's own fields

_lock = threading.Lock()
_writer: EventWriter | None = None
_writer_dir: Path | None = None


def run_dir() -> Path | None:
    """The job's run directory when running under torchyard, else None."""
    value = os.environ.get(RUN_DIR_ENV)
    return Path(value) if value else None


def enabled() -> bool:
    """True on global rank 0 under torchyard: the one process whose reports are recorded."""
    # torchrun sets RANK; a script started without it is a single process, hence rank 0.
    return run_dir() is not None and os.environ.get("RANK", "0") == "0"


def metrics(step: int, values: Mapping[str, Any] | None = None, /, *, epoch: int | None = None, **named: Any) -> None:
    """Record metric values at an optimizer step: ``metrics(100, loss=0.3)`` or ``metrics(100, {"eval/acc": 0.9})``.

    Names are stored as given (torchyard's catalog jobs use ``train/...`` and ``eval/...``). Values are
    numbers or anything ``float()`` accepts, such as a one-element tensor; NaN and infinity are stored as null.
    Steps should increase; a step reported again (after resuming) overwrites the earlier value.
    """
    points = {**(values or {}), **named}
    _check_step(step)
    clean = {str(name): _number(name, value) for name, value in points.items()}
    if not clean or not enabled():
        return
    extra = {} if epoch is None else {"epoch": int(epoch)}
    _emit("metric", step=int(step), values=clean, **extra)


def checkpoint(path: str | os.PathLike[str], step: int, *, epoch: int | None = None, **details: Any) -> None:
    """Record a checkpoint the script has finished writing (call it after the save, not before).

    ``path`` is a file or directory; relative paths are taken from the working directory, which under
    torchyard is the job's copy of its code inside the run directory (``workdir/``), kept across attempts.
    resume_path() returns the newest recorded one on a retry.
    """
    _check_step(step)
    reserved = _RESERVED.intersection(details)
    if reserved:
        raise TypeError(f"checkpoint details may not be named {sorted(reserved)}")
    if not enabled():
        return
    target = Path(os.path.abspath(path))
    if not target.exists():
        log.warning("report.checkpoint: %s does not exist; recorded anyway", target)
    base = run_dir()
    assert base is not None
    base = Path(os.path.abspath(base))
    # The events contract keeps paths under the run directory relative to it; anything else stays absolute.
    shown = str(target.relative_to(base)) if target.is_relative_to(base) else str(target)
    extra = {} if epoch is None else {"epoch": int(epoch)}
    _emit("checkpoint", step=int(step), path=shown, **extra, **details)


def resume_path() -> str | None:
    """The newest checkpoint this job reported that still exists, as an absolute path; for a job that
    retries a finished one, that job's latest checkpoint until this one reports its own; None on a fresh
    run or outside torchyard. Every rank may call it (each must load the checkpoint), not only rank 0."""
    base = run_dir()
    if base is None:
        return None
    own = _newest_reported(base)
    if own is not None:
        return own
    inherited = os.environ.get(RESUME_FROM_ENV)
    return str(Path(inherited).absolute()) if inherited and Path(inherited).exists() else None


def _newest_reported(base: Path) -> str | None:
    try:
        lines = (base / EVENTS_FILE).read_bytes().splitlines()
    except FileNotFoundError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        if not isinstance(event, dict) or event.get("type") != "checkpoint" or not isinstance(event.get("path"), str):
            continue
        seq = event.get("seq")
        if isinstance(seq, int) and (best is None or seq > best[0]):
            candidate = base / event["path"]  # an absolute path stays absolute
            if candidate.exists():
                best = (seq, str(candidate.absolute()))
    return best[1] if best else None


def close() -> None:
    """Close the events file. Optional: it is flushed after every event and closed at exit."""
    global _writer, _writer_dir
    with _lock:
        if _writer is not None:
            _writer.close()
        _writer, _writer_dir = None, None


def _emit(type_: str, **fields: Any) -> None:
    global _writer, _writer_dir
    base = run_dir()
    assert base is not None
    with _lock:
        if _writer is None or _writer_dir != base:
            # Opened on first use, not at import: the seq continues from what earlier attempts wrote.
            base.mkdir(parents=True, exist_ok=True)
            _writer, _writer_dir = EventWriter(base, enabled=True, sinks=sinks.build(base)), base
            atexit.register(close)  # flushes the TensorBoard/MLflow sinks at the script's end
            log.debug("reporting to %s", base / EVENTS_FILE)
        if "epoch" not in fields:
            fields["epoch"] = None
        _writer.emit(type_, **fields)


def _check_step(step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise TypeError(f"step must be a non-negative int, not {step!r}")


def _number(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metric {name!r}: {value!r} is not a number") from exc
    # Non-finite values pass: the events writer stores them as null, so a diverged loss shows as a gap, not a crash.
    return number
