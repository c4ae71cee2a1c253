"""A rank's output as it printed it: stdout and stderr interleaved in one file, in the order written.

torchrun's ``--redirects`` gives every rank two files, ``stdout.log`` and ``stderr.log``, so the order
between a ``print`` and a log line or a traceback is lost. Called first thing in a rank (the catalog
trainer's entry and the script bootstrap both do), ``interleave()`` makes:

* ``output.log`` next to torchrun's files: file descriptors 1 and 2 both point at it (one open file,
  O_APPEND), so every write, from Python, from C code, from a child process or from a crashing
  interpreter, lands there in order. Nothing sits in a buffer of ours, so a crash loses nothing.
* ``stdout.log`` / ``stderr.log`` keep a copy of what Python writes to ``sys.stdout`` / ``sys.stderr``
  (output that native code writes straight to fd 1 or 2 is only in ``output.log``).
* ``rank`` in the rank's directory: its global rank. torchrun names the directory by the *local* rank,
  and the nodes of a multi-node job share one log directory, so this is how a global rank's logs are
  found (``find_rank_dir``).
* ``ranks.log`` (``ranks-node-N.log`` on node N > 0) in torchrun's log directory: every complete line
  Python writes, prefixed ``[rank R]``, appended by all ranks of the node in one write per line, so the
  node's ranks read as one log, in order.

Outside torchrun's redirection (a terminal, a notebook, a pipe) it does nothing: output there is
already interleaved. Torch-free and stdlib-only, so it runs before anything heavy is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobspec.rank_logs import OUTPUT_LOG, RANK_MARK, merged_line_prefix, merged_log_name

_PARTIAL_MAX = 64 * 1024  # a line longer than this (a progress bar without newlines) is written in pieces
PROGRESS_EVERY_S = 2.0  # at most one progress-bar redraw per rank per this many seconds in the merged log


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Merged:
    """Complete lines of one rank, prefixed, appended to the node's shared file one write each.

    A progress bar (tqdm, Rich on a pipe) redraws its line with ``\r`` and no newline; each redraw is an
    update, shown as a line of its own at most every PROGRESS_EVERY_S, so a running bar is readable in the
    log instead of one line written at its end. The state a line ends on (the bar's last draw) always shows."""

    def __init__(self, fd: int, prefix: bytes, clock: Callable[[], float] = time.monotonic):
        self.fd, self.prefix = fd, prefix
        self.pending = b""
        self.lock = threading.Lock()
        self.clock = clock
        self.last_update = -PROGRESS_EVERY_S

    def _update(self, segments: list[bytes], out: list[bytes]) -> None:
        drawn = [s for s in segments if s.strip()]
        now = self.clock()
        if drawn and now - self.last_update >= PROGRESS_EVERY_S:
            out.append(drawn[-1])
            self.last_update = now

    def write(self, data: bytes) -> None:
        with self.lock:
            self.pending += data
            if b"\n" not in self.pending and b"\r" not in self.pending and len(self.pending) < _PARTIAL_MAX:
                return
            *lines, self.pending = self.pending.split(b"\n")
            out: list[bytes] = []
            for line in lines:
                *redraws, last = line.split(b"\r")
                if not last.strip() and redraws:  # "...\r\n": the line ends on its last draw
                    redraws, last = redraws[:-1], redraws[-1]
                self._update(redraws, out)
                out.append(last)
            if b"\r" in self.pending:
                *redraws, self.pending = self.pending.split(b"\r")
                self._update(redraws, out)
            if len(self.pending) >= _PARTIAL_MAX:
                out.append(self.pending)
                self.pending = b""
            if out:
                with contextlib.suppress(OSError):  # a full disk must not take the rank down with it
                    _write_all(self.fd, b"".join(self.prefix + line + b"\n" for line in out))

    def close(self) -> None:
        with self.lock:
            if self.pending.strip():
                with contextlib.suppress(OSError):
                    _write_all(self.fd, self.prefix + self.pending + b"\n")
            self.pending = b""


class _Tee(io.RawIOBase):
    """Writes go to ``fd`` (the interleaved file) first, then to the per-stream copy and the merged log."""

    def __init__(self, fd: int, copy_fd: int, merged: _Merged):
        super().__init__()
        self._fd, self._copy, self._merged = fd, copy_fd, merged

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        data = bytes(b)
        _write_all(self._fd, data)
        with contextlib.suppress(OSError):
            _write_all(self._copy, data)
        self._merged.write(data)
        return len(data)


def _text(raw: _Tee, like: io.TextIOBase | None, errors: str) -> io.TextIOWrapper:
    encoding = getattr(like, "encoding", None) or "utf-8"
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)  # type: ignore[arg-type]


_MERGED: _Merged | None = None  # this rank's merged log, once interleave() set it up


def interleave() -> bool:
    """Set up the files above; True when it did (this process's stdout is torchrun's ``stdout.log``)."""
    try:
        stdout_file = Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        return False
    if stdout_file.name != "stdout.log" or not stdout_file.is_file() or not stdout_file.parent.parent.name.startswith("attempt_"):
        return False
    rank_dir = stdout_file.parent
    global_rank = os.environ.get("RANK")
    if global_rank is not None:
        (rank_dir / RANK_MARK).write_text(global_rank)
    sys.stdout.flush()
    sys.stderr.flush()
    out_copy, err_copy = os.dup(1), os.dup(2)  # torchrun's per-stream files; not inherited by children
    fd = os.open(rank_dir / OUTPUT_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    node = int(os.environ.get("GROUP_RANK", "0") or 0)
    log_dir = rank_dir.parents[2]  # <log-dir>/<run id>/attempt_<restart>/<local rank>
    merged_fd = os.open(log_dir / merged_log_name(node), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    merged = _Merged(merged_fd, merged_line_prefix(os.environ.get("RANK", rank_dir.name)))
    sys.stdout = _text(_Tee(1, out_copy, merged), sys.__stdout__, "strict")
    sys.stderr = _text(_Tee(2, err_copy, merged), sys.__stderr__, "backslashreplace")
    global _MERGED
    _MERGED = merged
    atexit.register(merged.close)  # a last line without its newline still reaches the merged log
    return True


def close() -> None:
    """Write out a last line without its newline to the merged log, as the exit of a rank that ends without running
    atexit handlers (a rank forked from torchrun: trainer/__main__.py) must."""
    if _MERGED is not None:
        _MERGED.close()
