"""What a job wrote without the SDK, found in its run directory each supervisor tick: TensorBoard, Weights & Biases,
MLflow and Lightning CSVLogger scalars, the Hugging Face Trainer's own log and what the spec's templates find in rank
0's output (worker/tb_tail.py, worker/wandb_tail.py, worker/mlflow_tail.py, worker/csv_tail.py,
worker/hf_state_tail.py, worker/output_tail.py) and framework checkpoints (worker/checkpoints_found.py), stored
through jobs/store/ingest_found.py. Nothing here is required of the job: a script that writes none of it costs one
directory walk every few seconds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import DataError, IntegrityError
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.ingest_found import FoundCheckpoint, FoundPoint, ingest_found, last_found_seq
from jobspec.output_metrics import Template, compile_template
from jobspec.resume_args import render
from jobspec.spec import AnySpec, ScriptJobSpec
from worker import checkpoints_found, step_inside, workdir
from worker.csv_tail import CsvLoggerTail
from worker.hf_state_tail import TrainerStateTail
from worker.mlflow_tail import MlflowFilesTail, MlflowTail
from worker.output_tail import OutputMetricsTail
from worker.run_files import RESCAN_S, FileTail, Listing, Point
from worker.tb_tail import TensorBoardTail
from worker.wandb_tail import WandbTail

log = logging.getLogger(__name__)

T = TypeVar("T")


class MetricTails:
    """The tails of the metric files a job writes (TensorBoard's, W&B's, MLflow's, Lightning's CSV, the Hugging Face
    Trainer's state), read as one: ``ack`` confirms the points of the last ``read`` in the order it returned them."""

    def __init__(self, run_dir: Path, rescan_s: float, templates: Sequence[Template] = ()):
        self.run_dir = run_dir
        self.tails: tuple[FileTail, ...] = (TensorBoardTail(run_dir, rescan_s), WandbTail(run_dir, rescan_s),
                                            MlflowTail(run_dir, rescan_s), MlflowFilesTail(run_dir, rescan_s),
                                            TrainerStateTail(run_dir, rescan_s), CsvLoggerTail(run_dir, rescan_s))
        if templates:
            self.tails += (OutputMetricsTail(run_dir, templates, rescan_s),)
        self._unacked = [0] * len(self.tails)

    @property
    def unreadable(self) -> str | None:
        """What the job's status says about metric files that exist but this worker cannot read."""
        return "; ".join(t.unreadable for t in self.tails if t.unreadable) or None

    def read(self, force_scan: bool = False) -> list[Point]:
        listing = Listing(self.run_dir)  # one walk of the run directory for every tail due to look for new files
        batches = [tail.read(force_scan, listing) for tail in self.tails]
        self._unacked = [len(b) for b in batches]
        return [point for batch in batches for point in batch]

    def ack(self, count: int) -> None:
        for i, tail in enumerate(self.tails):
            take = min(count, self._unacked[i])
            tail.ack(take)
            self._unacked[i] -= take
            count -= take


class Found:
    def __init__(self, run_dir: Path, patterns: list[str] | None = None, since: float = 0.0, rescan_s: float = RESCAN_S,
                 enabled: bool = True, glob_root: Callable[[], Path] | None = None, templates: Sequence[Template] = ()):
        self.run_dir = run_dir
        # Where the script runs, so where its checkpoint.discover globs are matched: asked at each scan, since the
        # working directory is made after the attempt starts (worker/workdir.py).
        self.glob_root = glob_root or (lambda: run_dir)
        self.enabled = enabled
        self.patterns = patterns or []
        self.since = since  # checkpoints older than the job are not its own
        self.rescan_s = rescan_s
        self.metrics = MetricTails(run_dir, rescan_s, templates)
        self.seq: int | None = None  # the last found seq stored, read from SQL on first use
        self.stored: dict[Path, tuple[float, int | None]] = {}  # checkpoints stored: their mtime and step
        self._next_scan = 0.0

    def recorded(self) -> list[tuple[str, float, int | None]]:
        """The checkpoints stored in the job table so far: path in the run directory, time written, step (a copy: the
        uploads thread reads it while this one adds to it)."""
        return [(p.relative_to(self.run_dir).as_posix(), mtime, step) for p, (mtime, step) in list(self.stored.items())]

    def checkpoints(self, settled: bool = False, wait: bool = False) -> list[checkpoints_found.FoundCkpt]:
        """Complete checkpoints in the run directory now, oldest first. ``settled``: the ranks have ended, so nothing
        is still being written and a file saved in their last second counts (a cut-off torch.save file still does not).
        ``wait``: a file whose step is being read from inside is waited for, not left to the next scan."""
        settle_s = 0.0 if settled else checkpoints_found.SETTLE_S
        return checkpoints_found.discover(self.run_dir, self.patterns, time.time(), self.since, settle_s=settle_s,
                                          glob_root=self.glob_root(), wait=wait or settled)

    def _new_checkpoints(self, final: bool) -> dict[Path, FoundCheckpoint]:
        now = time.monotonic()
        if not final and now < self._next_scan:
            return {}
        self._next_scan = now + self.rescan_s
        fresh = {}
        for c in self.checkpoints(settled=final):
            if self.stored.get(c.path) == (c.mtime, c.step):
                continue
            relative = str(c.path.relative_to(self.run_dir))
            details: dict[str, Any] = {"found": c.kind, "step_known": c.step is not None}
            if c.path.is_file():
                details["weights"] = relative  # the file itself downloads as the checkpoint's weights
            # An unknown step is stored at the job's step when it was found (jobs/store/ingest_found.py).
            fresh[c.path] = FoundCheckpoint(c.step if c.step is not None else -1, relative, c.mtime, details)
        if step_inside.READER.busy():
            self._next_scan = now  # a step is being read from inside a file: list it as soon as it is known
        return fresh

    def ingest(self, session: Session, job_id: str, guard: list[Any], db: Callable[[Callable[[], T], str], T],
               batch: int, final: bool = False) -> int:
        """Store what is new; returns how many points and checkpoints were stored. ``db`` runs a database
        call through a blip (the supervisor's retry); ``final`` looks for new files at once."""
        if not self.enabled:
            return 0
        points = self.metrics.read(force_scan=final)
        found = self._new_checkpoints(final)
        if not points and not found:
            return 0
        if self.seq is None:
            self.seq = db(lambda: last_found_seq(session, job_id), "reading found metrics")
        stored = 0
        for i in range(0, max(len(points), 1), batch):
            chunk = [FoundPoint(p.name, p.step, p.value, p.time) for p in points[i:i + batch]]
            ckpts = list(found.values()) if i == 0 else []

            def store(after: int = self.seq, chunk: list[FoundPoint] = chunk, ckpts: list[FoundCheckpoint] = ckpts) -> int:
                return ingest_found(session, job_id, after, chunk, ckpts, guard=guard)

            try:
                self.seq = db(store, "storing found metrics and checkpoints")
            except (DataError, IntegrityError) as exc:
                # A job's own files are its input: a batch SQL refuses for what it holds is dropped and logged, and the
                # attempt goes on (it used to end the node's task, and the job with it, on its lease).
                session.rollback()
                log.warning("job %s: %d found metric points and %d checkpoints not stored: %s", job_id, len(chunk),
                            len(ckpts), exc.orig if exc.orig is not None else exc)
            else:
                stored += len(chunk) + len(ckpts)
            self.metrics.ack(len(chunk))
            if ckpts:  # not offered again either way: a refused one would be refused at every tick
                self.stored.update({path: (c.mtime, c.step if c.step >= 0 else None) for path, c in found.items()})
        return stored


@dataclass(frozen=True)
class Resume:
    """What a resuming attempt of a script runs: its spec (``resume_args`` appended when a checkpoint exists), the
    step it resumes from when known, and, when its ``resume_args`` could not be applied, why, in a user's words."""

    spec: AnySpec
    step: int | None = None
    note: str | None = None


def not_applied(patterns: list[str]) -> str:
    """What a user reads on an attempt that resumed without its resume_args (pure)."""
    where = ", ".join(patterns) if patterns else "the Lightning, Hugging Face and Accelerate layouts"
    hint = "" if patterns else " (name your own with checkpoint.discover)"
    return f"resume_args not applied: no checkpoint found under {where}{hint}"


def resume_arguments(spec: AnySpec, found: Found, resumes: bool, inherited: str | None) -> Resume:
    """The spec this attempt runs: a script's ``resume_args`` appended to its args when the attempt resumes and a
    checkpoint exists (the latest complete one in the run directory, else ``inherited``, a retried job's), with the
    step it resumes from when known."""
    if not isinstance(spec, ScriptJobSpec) or not spec.resume_args or not resumes:
        return Resume(spec)
    latest = checkpoints_found.latest(found.checkpoints(wait=True))
    if latest is not None:
        where, step = str(latest.path.resolve()), latest.step
    elif inherited:
        where, step = inherited, None
    else:
        note = not_applied(found.patterns)
        log.info("run %s: %s", found.run_dir, note)
        return Resume(spec, note=note)
    log.info("run %s resumes from %s (step %s)", found.run_dir, where, step)
    return Resume(spec.model_copy(update={"args": [*spec.args, *render(spec.resume_args, where)]}), step)


def found_in_run(settings: Settings, run_dir: Path, spec: AnySpec, created_at: datetime) -> Found:
    """What the worker looks for in this job's run directory: nothing for a catalog job (its trainer reports everything)."""
    if not isinstance(spec, ScriptJobSpec):
        return Found(run_dir, enabled=False)
    return Found(run_dir, spec.checkpoint.discover, since=created_at.timestamp() - 1,
                 glob_root=lambda: workdir.working_dir(settings, spec, run_dir),
                 templates=[compile_template(t) for t in spec.metrics.from_output])
