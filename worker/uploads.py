"""A job's run directory mirrored to the object store (TORCHYARD_STORAGE_URL), in the background of its attempt.

Every TORCHYARD_STORAGE_SYNC_INTERVAL_S a thread uploads what changed: each committed checkpoint under
``checkpoints/`` once, manifest last (jobs/storage/checkpoints.py), and the events file, the error files and the
logs, so a host that dies leaves its attempt readable. The supervisor's loop never waits on it; at the end,
``finish`` uploads the rest (the artifacts too) before the verdict is written, so a job is marked succeeded only
once its files are in the store. Before the ranks start, ``restore`` brings down what a resume on this host lacks:
the newest complete checkpoint and the events file (the trainer's seq goes on from it).

Every file is opened without following links (jobs/artifacts.open_under): what a job planted in its directory
never takes the worker's reach elsewhere. A store that does not answer is tried again at the next pass, without
end: nothing is lost, only late.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from jobs.reads.artifacts import ARTIFACTS_DIR, open_under, single_files
from jobs.reads.workdir_files import list_written
from jobs.settings import Settings
from jobs.storage import checkpoints as stored
from jobs.storage import found_checkpoints
from jobs.storage.manifest import ManifestError, manifest_key, step_of
from jobs.storage.store import NotInStore, ObjectStore, StoreError, store_for, until_answered
from torchyard.atomic import write_atomic

log = logging.getLogger(__name__)

LATEST = "latest"  # trainer/checkpoint.py's pointer to the newest committed checkpoint
_TOP_FILES = ("events.jsonl", "error.json")
_RETRY_S = 1.0  # between tries while the store does not answer
# How long the end of an attempt waits for a store that does not answer: a success is not recorded before its files
# are stored unless the store stays away this long; any other end only tries.
SUCCESS_WAIT_S = 600.0
OTHER_WAIT_S = 30.0
RESTORE_WAIT_S = 120.0  # how long a start waits for the store before it resumes from what its host has
MAX_WORKDIR_FILES = 100_000  # of a script's working directory, uploaded at the end

Recorded = Callable[[], list[tuple[str, float, int | None]]]  # worker/found.py: Found.recorded


class Uploads:
    """One attempt's uploads; a no-op without a store."""

    def __init__(self, store: ObjectStore | None, job_id: str, run_dir: Path, interval_s: float = 5.0,
                 found: Recorded = list):
        self.store, self.job_id, self.run_dir, self.interval_s = store, job_id, run_dir, interval_s
        self.found = found  # a script's own checkpoints, as the job table records them
        self.sent: dict[str, tuple[int, int]] = {}  # path in the run directory -> (size, mtime_ns) as uploaded
        self.checkpoints_sent: set[str] = set()
        self.found_sent: dict[str, float] = {}  # path of a found checkpoint -> the time of the version uploaded
        self.found_gone: set[str] = set()  # found checkpoints pruned here and removed from the store
        self.failing = False  # the last pass failed: logged once per outage
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.extra = {"job_id": job_id}

    @classmethod
    def of(cls, settings: Settings, job_id: str, run_dir: Path, found: Recorded = list) -> Uploads:
        return cls(store_for(settings), job_id, run_dir, settings.storage_sync_interval_s, found)

    def start(self) -> None:
        if self.store is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"uploads-{self.job_id}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after the file it is sending)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, succeeded: bool, keep_going: Callable[[], object] = lambda: None, wait_s: float | None = None) -> bool:
        """Upload everything left, the artifacts too, trying again while the store does not answer, for up to
        ``wait_s`` (default: SUCCESS_WAIT_S after a success, else OTHER_WAIT_S); ``keep_going`` is called between
        tries (the lease's heartbeat). True once all is in the store."""
        if self.store is None:
            return True
        self.stop()
        wait_s = wait_s if wait_s is not None else SUCCESS_WAIT_S if succeeded else OTHER_WAIT_S
        deadline = time.monotonic() + wait_s
        while not self.sync(final=True):
            if time.monotonic() > deadline:
                log.error("job %s: the object store did not take the job's last files within %.0fs; they stay on this host "
                          "under %s", self.job_id, wait_s, self.run_dir, extra=self.extra)
                return False
            keep_going()
            time.sleep(_RETRY_S)
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sync()

    def sync(self, final: bool = False) -> bool:
        """One pass: what changed goes up. False when the store failed (the next pass tries again)."""
        try:
            self._checkpoints()
            self._found()
            self._files(final)
        except StoreError as exc:
            if not self.failing:
                log.warning("job %s: uploads paused: %s; trying again every %.0fs", self.job_id, exc, self.interval_s,
                            extra=self.extra)
            self.failing = True
            return False
        except Exception:  # never let the thread die: the next pass tries again
            log.exception("job %s: upload pass failed", self.job_id, extra=self.extra)
            return False
        if self.failing:
            log.info("job %s: uploads resumed", self.job_id, extra=self.extra)
            self.failing = False
        return True

    def _checkpoints(self) -> None:
        assert self.store is not None
        root = self.run_dir / stored.CHECKPOINTS
        try:
            names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
        except OSError:
            return
        for name in names:
            if name in self.checkpoints_sent:
                continue
            # Uploaded by an earlier attempt (this host's or another's): once is enough.
            if self.store.size(stored.job_key(self.job_id, f"{stored.CHECKPOINTS}/{manifest_key(name)}")) is None:
                try:
                    stored.upload_checkpoint(self.store, self.job_id, root / name)
                except OSError as exc:  # pruned by the trainer meanwhile (keep_last): a newer one follows
                    log.info("job %s: checkpoint %s not uploaded: %s", self.job_id, name, exc, extra=self.extra)
                    if (root / name).is_dir():
                        continue  # still there: try again next pass
            self.checkpoints_sent.add(name)
        # Pruned here since (the trainer's keep_last), once every newer one is in the store (uploaded above): gone there too.
        for name in sorted(self.checkpoints_sent - set(names)):
            stored.delete_checkpoint(self.store, self.job_id, name)
            self.checkpoints_sent.discard(name)
            log.info("job %s: checkpoint %s pruned on this host; removed from the object store", self.job_id, name,
                     extra=self.extra)

    def _found(self) -> None:
        """A script's own checkpoints (nanoGPT's out/ckpt.pt, a Trainer's checkpoint-N/), each version once."""
        assert self.store is not None
        for relative, mtime, step in self.found():
            if self.found_sent.get(relative) == mtime:
                continue
            try:
                sent = found_checkpoints.upload_found(self.store, self.job_id, self.run_dir, relative, mtime, step)
            except OSError as exc:  # pruned by the framework, or saved again: the newer version is recorded and sent
                log.info("job %s: found checkpoint %s not uploaded: %s", self.job_id, relative, exc, extra=self.extra)
            else:
                self.sent.update(sent or {})
                self.found_gone.discard(relative)
            self.found_sent[relative] = mtime
        # Pruned by the framework since (a Trainer's save_total_limit), once the newer ones are in (above): gone there too.
        for relative in [r for r in self.found_sent if r not in self.found_gone and not os.path.lexists(self.run_dir / r)]:
            found_checkpoints.delete_found(self.store, self.job_id, relative)
            self.found_gone.add(relative)
            log.info("job %s: found checkpoint %s pruned on this host; removed from the object store", self.job_id,
                     relative, extra=self.extra)

    def _files(self, final: bool) -> None:
        """The events file, error files and logs (and at the end the artifacts and what a script wrote in its working
        directory) whose size or time changed."""
        candidates: list[str] = [name for name in _TOP_FILES if (self.run_dir / name).is_file()]
        candidates += [p.name for p in self.run_dir.glob("error-node-*.json")]
        candidates += [f"logs/{rel}" for rel, _st in single_files(self.run_dir / "logs")]
        if final:
            candidates += [f"{ARTIFACTS_DIR}/{rel}" for rel, _st in single_files(self.run_dir / ARTIFACTS_DIR)]
            candidates += [path for path, _size, _mtime in list_written(self.run_dir, MAX_WORKDIR_FILES)]
        assert self.store is not None
        for relative in candidates:
            try:
                with open_under(self.run_dir, relative, single_link=True) as f:
                    st = os.fstat(f.fileno())
                    if self.sent.get(relative) == (st.st_size, st.st_mtime_ns):
                        continue
                    self.store.put_open(stored.job_key(self.job_id, relative), f)
            except FileNotFoundError:  # gone, or not a plain file of the job's own
                continue
            self.sent[relative] = (st.st_size, st.st_mtime_ns)


def _before_start(settings: Settings, job_id: str, what: Callable[[ObjectStore], object], keep_going: Callable[[], bool],
                  wait_s: float) -> str | None:
    """``what`` with the store, waited for while it does not answer (``until_answered``): None, or a note for the
    attempt when the store could not be read (the attempt goes on with what this host has). None without a store."""
    store = store_for(settings)
    if store is None:
        return None
    try:
        until_answered(lambda: what(store), keep_going, wait_s, _RETRY_S)
    except StoreError as exc:
        note = f"the object store could not be read before the start ({exc}); resumed from what this host has"
        log.warning("job %s: %s", job_id, note, extra={"job_id": job_id})
        return note
    return None


def restore(settings: Settings, job_id: str, run_dir: Path, keep_going: Callable[[], bool],
            wait_s: float = RESTORE_WAIT_S, resume_from: str | None = None) -> str | None:
    """Before the ranks start: bring down from the store what this host's run directory lacks for a resume (for a
    retried job with no checkpoint of its own yet, the checkpoint of the job it retries, ``resume_from``), waiting up
    to ``wait_s`` for a store that does not answer (``keep_going`` False stops the wait). Returns a note for the
    attempt when the store could not be read (the attempt goes on with what this host has), else None."""
    return _before_start(settings, job_id, lambda store: _restore(store, job_id, run_dir, resume_from), keep_going, wait_s)


def restore_found(settings: Settings, job_id: str, run_dir: Path, keep_going: Callable[[], bool],
                  wait_s: float = RESTORE_WAIT_S) -> str | None:
    """A script's: once its working directory is made, the newest complete checkpoint its framework wrote, from the
    store (jobs/storage/found_checkpoints.py); a note as ``restore`` gives one. A link the job planted where the
    checkpoint goes leaves it out, said in the note."""
    try:
        return _before_start(settings, job_id, lambda store: found_checkpoints.restore_found(store, job_id, run_dir),
                             keep_going, wait_s)
    except OSError as exc:
        note = f"the checkpoint in the object store was not restored: {exc}"
        log.warning("job %s: %s", job_id, note, extra={"job_id": job_id})
        return note


def _restore(store: ObjectStore, job_id: str, run_dir: Path, resume_from: str | None = None) -> None:
    events = run_dir / "events.jsonl"
    remote = store.size(stored.job_key(job_id, "events.jsonl"))
    local = events.stat().st_size if events.is_file() else 0
    if remote is not None and remote > local:  # append-only: the longer one is the newer
        store.get_file(stored.job_key(job_id, "events.jsonl"), events)
    newest = stored.newest_stored(store, job_id)
    checkpoints = run_dir / stored.CHECKPOINTS
    if newest is None:
        if resume_from and not (checkpoints / LATEST).exists():
            _adopt_stored(store, job_id, checkpoints, PurePosixPath(resume_from))
        return
    try:
        here = (checkpoints / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        here = ""
    here_step = step_of(here) if here and (checkpoints / here / "meta.json").is_file() else None
    if here_step is not None and newest.step is not None and here_step >= newest.step:
        return
    checkpoints.mkdir(parents=True, exist_ok=True)
    if not (checkpoints / newest.name).is_dir():  # a committed directory here is whole (renamed into place)
        stored.download_checkpoint(store, job_id, newest, checkpoints)
    write_atomic(checkpoints / LATEST, newest.name)
    log.info("job %s: resumes from checkpoint %s of the object store", job_id, newest.name, extra={"job_id": job_id})


def _adopt_stored(store: ObjectStore, job_id: str, checkpoints: Path, source: PurePosixPath) -> None:
    """A retried job's first checkpoint: the one of the job it retries (``runs/<that job>/checkpoints/<name>``), from the
    store, where this host's runs directory does not have it (worker/attempt_dir.py adopts it where it does)."""
    if source.parent.name != stored.CHECKPOINTS or not source.parent.parent.name:
        return
    retried = source.parent.parent.name
    try:
        manifest = stored.complete_stored(store, retried, source.name)
    except (NotInStore, ManifestError) as exc:
        log.warning("job %s: checkpoint %s of job %s is not complete in the object store (%s); starting from scratch",
                    job_id, source.name, retried, exc, extra={"job_id": job_id})
        return
    checkpoints.mkdir(parents=True, exist_ok=True)
    stored.download_checkpoint(store, retried, manifest, checkpoints)
    write_atomic(checkpoints / LATEST, manifest.name)
    log.info("job %s: starts from checkpoint %s of job %s, from the object store", job_id, manifest.name, retried,
             extra={"job_id": job_id})
