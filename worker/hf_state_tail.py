"""Metrics a Hugging Face ``Trainer`` keeps in its own ``trainer_state.json``, for a script that reports to nothing.

transformers 5 changed ``TrainingArguments.report_to``'s default from ``"all"`` to ``"none"``, so a script written
for 4.x (where the default logged to TensorBoard whenever it was installed) writes no metric file under 5.x: what
it logged is only in ``log_history``, the list the Trainer saves in every ``checkpoint-N/trainer_state.json`` (and
in ``<output_dir>/trainer_state.json`` when the script calls ``trainer.save_state()``). Each entry there holds what
one ``Trainer.log`` call logged and the ``step`` it was at. The points get the names the Trainer's own TensorBoard
callback gives them (``loss`` is ``train/loss``, ``eval_loss`` is ``eval/loss``), and its float32 values: a script
that does report to TensorBoard writes every point twice, and both reads are then one point
(jobs/store/ingest_found.py keeps a point stored with the same value).

A checkpoint's file is written once, last in its directory, and holds the run's whole history so far, so once a
newer checkpoint of the same output directory has been read, an older one is not followed any more (a run keeping
every checkpoint would otherwise fill the files a tail follows). A file is read again when its size or mtime
changes (``save_state`` rewrites the one in the output directory); JSON cut off by a write still under way is read
on a later tick.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.store.ingest_found import MAX_STEP
from worker.checkpoints_found import HF_CHECKPOINT_DIR, MAX_TRAINER_STATE, TRAINER_STATE
from worker.run_files import MAX_WALK, FileTail, LastOffered, Listing, Point, open_in

log = logging.getLogger(__name__)



def metric_name(key: str) -> str:
    """The name the Trainer's TensorBoard callback logs ``key`` under (its ``rewrite_logs``; pure)."""
    for prefix, group in (("eval_", "eval/"), ("test_", "test/")):
        if key.startswith(prefix):
            return group + key[len(prefix):]
    return "train/" + key


def as_float32(value: float) -> float:
    """``value`` as TensorBoard keeps it (a float32), so the same point read from both files is equal (pure)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return value  # beyond float32: TensorBoard keeps an infinity, which is a gap either way


def history_points(history: Any, when: float) -> list[Point]:
    """The numbers in a ``log_history`` list, each at its entry's ``step`` (pure). What is not a number (a string, a
    bool, a nested value) and an entry without a whole step are left out, as the TensorBoard callback leaves them."""
    points: list[Point] = []
    if not isinstance(history, list):
        return points
    for entry in history:
        if not isinstance(entry, dict):
            continue
        step = entry.get("step")
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            continue
        for key, value in entry.items():
            if key != "step" and isinstance(key, str) and type(value) in (int, float):
                points.append(Point(metric_name(key), step, as_float32(float(value)), when))
    return points


@dataclass
class _State:
    signature: tuple[int, int] | None = None  # size and mtime when last read whole
    output_dir: Path | None = None
    checkpoint: int | None = None  # N of checkpoint-N/, when the file is a checkpoint's


class TrainerStateTail(FileTail[_State]):
    """Follows the ``trainer_state.json`` files under ``root``: what each adds to ``log_history`` becomes points."""

    def __init__(self, root: Path, rescan_s: float):
        super().__init__(root, rescan_s)
        self.offered = LastOffered()
        self.newest: dict[Path, int] = {}  # per output directory: the newest checkpoint read
        self.retired: set[Path] = set()  # older checkpoints of an output directory whose newer one was read

    def matches(self, name: str) -> bool:
        return name == TRAINER_STATE

    def candidates(self, listing: Listing) -> list[Path]:
        # Oldest checkpoint first: each holds the history so far, so the newest read is what stays.
        found = [p for p in listing.matching(self.matches, limit=MAX_WALK) if p not in self.retired]
        return sorted(found, key=_reading_order)

    def open(self, path: Path) -> _State:
        folder = path.parent
        if (number := _checkpoint_number(folder)) is not None:
            return _State(output_dir=folder.parent, checkpoint=number)
        return _State(output_dir=folder)

    def new_points(self, path: Path, state: _State) -> list[Point]:
        try:
            st = os.lstat(path)
        except OSError:
            return []
        signature = (st.st_size, st.st_mtime_ns)
        if signature == state.signature:
            return []
        if st.st_size > MAX_TRAINER_STATE:
            log.warning("%s: %d bytes, more than the %d read; its log_history is not read", path, st.st_size, MAX_TRAINER_STATE)
            state.signature = signature
            return []
        try:
            with open_in(self.root, path) as f:
                history = json.loads(f.read(MAX_TRAINER_STATE)).get("log_history")
        except (OSError, ValueError, AttributeError):
            return []  # not there any more, or cut off by a write still under way: read on a later tick
        state.signature = signature
        points = self.offered.changed(history_points(history, st.st_mtime))
        if state.checkpoint is not None and state.output_dir is not None:
            self.newest[state.output_dir] = max(self.newest.get(state.output_dir, -1), state.checkpoint)
        return points

    def read(self, force_scan: bool = False, listing: Listing | None = None) -> list[Point]:
        points = super().read(force_scan, listing)
        for path, state in list(self.files.items()):
            superseded = state.checkpoint is not None and state.signature is not None and state.output_dir is not None \
                and state.checkpoint < self.newest.get(state.output_dir, -1)
            if superseded or not os.path.lexists(path):
                del self.files[path]  # a vanished file (a rotated checkpoint) is found again if it comes back
            if superseded:
                self.retired.add(path)
        return points


def _reading_order(path: Path) -> tuple[int, str]:
    number = _checkpoint_number(path.parent)
    return (number if number is not None else MAX_STEP + 1, str(path))


def _checkpoint_number(folder: Path) -> int | None:
    m = HF_CHECKPOINT_DIR.match(folder.name)
    return int(m.group(1)) if m is not None else None
