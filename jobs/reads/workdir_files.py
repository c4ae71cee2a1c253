"""A script job's working directory (``runs/<id>/workdir``) as the API serves it: the files the job wrote or
changed there, not the ones it was uploaded with.

The worker copies the job's code into ``workdir/`` once (worker/workdir.py) and records what it copied in
``workdir.json`` beside it: path, size and modification time of every uploaded file. A file is the job's when
the copy never had it, or when its size or modification time moved since. Python's ``__pycache__`` is neither.
The record lies in the job's own run directory, so it is read as untrusted: at most ``MANIFEST_LIMIT`` bytes,
never through a link, and a record that does not parse lists every file (hiding nothing but the uploads).

Listed paths start with ``workdir/`` and download through ``/v1/jobs/{id}/artifacts/workdir/...``, opened
with ``jobs.reads.artifacts.open_under`` like every other artifact: no symlink followed, regular files with one link.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO

from jobs.reads.artifacts import open_under, single_files

log = logging.getLogger(__name__)

WORKDIR_NAME = "workdir"  # the job's writable copy of its code: runs/<id>/workdir
MANIFEST_NAME = "workdir.json"  # what was uploaded into it: {"files": {path: [size, mtime_ns]}}
MANIFEST_LIMIT = 64 * 1024 * 1024
SKIP_DIRS = frozenset({"__pycache__"})
PREFIX = WORKDIR_NAME + "/"

Uploaded = dict[str, tuple[int, int]]


def manifest_json(files: Uploaded) -> str:
    return json.dumps({"files": {p: [size, mtime_ns] for p, (size, mtime_ns) in sorted(files.items())}})


def read_manifest(run_dir: Path) -> Uploaded:
    """The uploaded files' sizes and mtimes; empty (every file is the job's) when the record is missing or garbled."""
    try:
        with open_under(run_dir, MANIFEST_NAME, single_link=True) as f:
            raw = json.loads(f.read(MANIFEST_LIMIT))
        return {str(p): (int(v[0]), int(v[1])) for p, v in raw["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("%s: unreadable %s (%s); listing every file of the working directory", run_dir, MANIFEST_NAME, exc)
        return {}


def _written(st: os.stat_result, uploaded: tuple[int, int] | None) -> bool:
    return uploaded is None or uploaded != (st.st_size, st.st_mtime_ns)


def list_written(run_dir: Path, limit: int) -> list[tuple[str, int, float]]:
    """(``workdir/<path>``, size, modified) of every file the job wrote or changed in its working directory, sorted,
    at most ``limit``. Symlinks are neither listed nor followed; files with several hard links are not listed."""
    uploaded = read_manifest(run_dir)
    written = ((PREFIX + rel, st.st_size, st.st_mtime) for rel, st in single_files(run_dir / WORKDIR_NAME, SKIP_DIRS)
               if _written(st, uploaded.get(rel)))
    return sorted(itertools.islice(written, limit))


def open_written(run_dir: Path, relative: str) -> BinaryIO:
    """``workdir/<path>`` when the job wrote or changed it, opened by ``open_under``; FileNotFoundError otherwise
    (an uploaded file as it was, a cache, a link, anything ``open_under`` refuses)."""
    if not relative.startswith(PREFIX):
        raise FileNotFoundError(relative)
    inner = relative[len(PREFIX):]
    if not inner or inner.startswith("/") or "\\" in inner or any(p in SKIP_DIRS for p in inner.split("/")):
        raise FileNotFoundError(relative)
    f = open_under(run_dir, relative, single_link=True)
    if not _written(os.fstat(f.fileno()), read_manifest(run_dir).get(inner)):
        f.close()
        raise FileNotFoundError(relative)
    return f
