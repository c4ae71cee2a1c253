"""Files replaced whole: a reader (the API, the worker, the next attempt, the CLI) sees the old content or the new,
never half of it. The new content goes to a hidden temporary beside the file, then ``os.replace`` swaps it in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temporary_for(path: Path) -> Path:
    """Where a new ``path`` is written before it replaces the old: beside it (the same filesystem), hidden."""
    return path.with_name(f".{path.name}.tmp")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yields the temporary to write ``path``'s new content to; swapped in when the block ends without an error,
    removed otherwise. An OSError names ``path`` when the failed call named no file (write(2) names none): the
    error a job or a user sees must say where the disk filled up."""
    tmp = temporary_for(path)
    try:
        yield tmp
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        tmp.unlink(missing_ok=True)
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_atomic(path: Path, data: str | bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8); ``mode`` before the umask, e.g. 0o600 for a secret."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with replacing(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
