"""Scalars from every TensorBoard event file a job writes, wherever it writes them.

Lightning's TensorBoardLogger, the Hugging Face Trainer's ``report_to="tensorboard"``, Accelerate's
``log_with="tensorboard"`` and a plain ``SummaryWriter`` all write ``events.out.tfevents.*`` files
somewhere under the working directory. Each file is read incrementally with tensorboard's own loader
(it keeps its place and leaves a half-written record for the next read); what one ``read`` returns is
held until ``ack`` (worker/run_files.py).
torchyard's own ``artifacts/tensorboard`` is skipped: it mirrors the SDK's metrics, which arrive through events.jsonl.
So are event files the job was uploaded with and never changed (an old local run's): they are not this job's metrics.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jobs.store.ingest_found import MAX_STEP
from worker.run_files import FileTail, Point, open_in

log = logging.getLogger(__name__)

EVENT_FILE_MARK = "tfevents"


def scalars(event: Any, plugins: dict[str, str]) -> list[Point]:
    """The scalar values of one event (after tensorboard's compat migration: simple_value becomes a tensor).
    ``plugins`` remembers each tag's plugin: TF2 writers put the metadata on a tag's first value only."""
    if not event.HasField("summary"):
        return []
    from tensorboard.util import tensor_util  # numpy and protobuf, only once a file is read

    points = []
    step = int(event.step)
    for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        if plugin:
            plugins[value.tag] = plugin
        if plugins.get(value.tag) != "scalars" or not value.HasField("tensor"):
            continue
        try:
            array = tensor_util.make_ndarray(value.tensor)
            number = float(array.item())
        except (ValueError, TypeError):
            continue
        if 0 <= step <= MAX_STEP:
            points.append(Point(value.tag, step, number, float(event.wall_time)))
    return points


class _File:
    def __init__(self, root: Path, path: Path):
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        # Opened here without following a link, and read by the loader through this descriptor: a link the job puts
        # in the file's place later is never followed (the loader opens paths itself).
        self.handle = open_in(root, path)
        self.loader = EventFileLoader(f"/proc/self/fd/{self.handle.fileno()}")
        self.plugins: dict[str, str] = {}


class TensorBoardTail(FileTail[_File]):
    """Follows the event files under ``root``."""

    def matches(self, name: str) -> bool:
        return EVENT_FILE_MARK in name

    def open(self, path: Path) -> _File:
        return _File(self.root, path)

    def missing(self, path: Path, exc: ImportError) -> str:
        return (f"warning: the job wrote TensorBoard event files ({path.relative_to(self.root)}) but this worker cannot "
                f"read them ({exc}), so their scalars are not in its metrics; the worker's environment needs tensorboard "
                "(`pip install -e .` installs it)")

    def new_points(self, path: Path, state: _File) -> list[Point]:
        points: list[Point] = []
        try:
            for event in state.loader.Load():
                points.extend(scalars(event, state.plugins))
        except Exception as exc:  # noqa: BLE001 - a corrupt record ends that file's reading, not the job
            log.warning("event file %s: %s", path, exc)
        return points
