"""An object of the store opened as a read-only, seekable file, so the API serves it as it serves a file of a run
directory (whole or one range, jobs/artifacts.iter_file): each read past the buffer is one ranged GET."""

from __future__ import annotations

import io
import os
from typing import BinaryIO

from jobs.storage.store import ObjectStore

BUFFER = 8 * 1024 * 1024  # bytes fetched per GET while a file is read through


class StoredFile(io.RawIOBase):
    def __init__(self, store: ObjectStore, key: str, size: int):
        self.store, self.key, self.size, self.pos = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        data = self.store.get_bytes(self.key, self.pos, self.pos + want - 1)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def open_stored(store: ObjectStore, key: str) -> BinaryIO:
    """The object at ``key`` opened for reading; FileNotFoundError when the store does not hold it."""
    size = store.size(key)
    if size is None:
        raise FileNotFoundError(key)
    return io.BufferedReader(StoredFile(store, key, size), buffer_size=BUFFER)  # type: ignore[return-value]


def size_of(f: BinaryIO) -> int:
    """The size of a file the API opened: a stored object's as listed, a local file's as it was opened."""
    raw = getattr(f, "raw", None)
    return raw.size if isinstance(raw, StoredFile) else os.fstat(f.fileno()).st_size
