"""The step a checkpoint file holds inside, for a file whose name names none (nanoGPT's ``out/ckpt.pt``,
Lightning's ``last.ckpt``): the first of STEP_KEYS that is a non-negative int when the file is a mapping.

The file is the job's, so it is read as untrusted, stricter than ``torch.load(weights_only=True)``: only the
pickle of torch's zip format (``<name>/data.pkl``, at most MAX_PICKLE_BYTES; tensors' storages are never
read) is unpickled, with every global it names replaced by an inert stand-in, so no code of the file's runs.
Files over MAX_BYTES are not read. The read is a stdlib-only child process (no torch import: that alone took
6 to 30 s on a loaded host, longer than a lease), killed after TIMEOUT_S, so a huge or hostile file costs one
short-lived child and never stalls the worker; the worker opens the file (no link followed, a FIFO refused) and
hands the child that descriptor as its stdin, never the path. A file in torch's legacy (non-zip) format names
no step here. Reads run on one background thread: a supervisor tick asks ``step(root, path)`` and gets PENDING
until the answer is there (the checkpoint is listed on a later scan), and a caller that needs the answer now (a
resume, the attempt's last scan) waits.
Answers are cached by the file's path, size and mtime: a rewritten file is read again.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from worker.run_files import open_in

log = logging.getLogger(__name__)

STEP_KEYS: Final = ("global_step", "iter_num", "step", "epoch")  # Lightning's first: its files also hold 'epoch'
MAX_CACHED: Final = 4096
MAX_BYTES: Final = 2 * 1024**3  # larger files are not opened: their step comes from the order of writing
MAX_PICKLE_BYTES: Final = 64 * 1024**2  # a checkpoint's pickle holds its structure; the tensors are beside it
TIMEOUT_S: Final = 10.0
PENDING: Final = object()  # the read is under way

_READER = r"""
import json, pickle, sys, zipfile

class Stub(dict):
    # Stands for every global the file names (torch's tensor rebuilders, OrderedDict, any class): nothing of
    # the file's is ever imported or called, and a mapping stays a mapping.
    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

class Reader(pickle.Unpickler):
    def find_class(self, module, name):
        return Stub

    def persistent_load(self, pid):
        return None  # a tensor's storage: never read

limit, keys = int(sys.argv[1]), sys.argv[2:]
with zipfile.ZipFile(open(0, "rb")) as archive:  # the file, opened by the worker, is this process's stdin
    (pkl,) = [i for i in archive.infolist() if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
    if pkl.file_size > limit:
        sys.exit("data.pkl too large")
    with archive.open(pkl) as f:
        data = Reader(f).load()
print(json.dumps({k: data[k] for k in keys if type(data.get(k)) is int} if isinstance(data, dict) else None))
"""


def step_in(data: Any) -> int | None:
    """The step a loaded checkpoint names (pure): the first of STEP_KEYS holding a non-negative int (a bool is no
    step). The child process hands back only the mapping's int values under those keys."""
    if not isinstance(data, dict):
        return None
    for key in STEP_KEYS:
        value = data.get(key)
        if type(value) is int and value >= 0:
            return value
    return None


def read_step(root: Path, path: Path, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BYTES) -> int | None:
    """The step inside ``path`` (a file under ``root``), read in a child process; None when it names none, is too
    large, is not a torch zip file, or takes longer than ``timeout_s``. The worker opens the file (no link followed, a
    FIFO refused: worker/run_files.py open_in) and hands the child that descriptor, never the path."""
    try:
        f = open_in(root, path)
    except OSError:
        return None
    with f:
        if os.fstat(f.fileno()).st_size > max_bytes:
            log.info("%s is over %d bytes: its step is not read from inside", path, max_bytes)
            return None
        try:
            # -I: nothing of the job's (its directory, PYTHONPATH, user site) is imported by the reader.
            done = subprocess.run([sys.executable, "-I", "-c", _READER, str(MAX_PICKLE_BYTES), *STEP_KEYS],
                                  capture_output=True, timeout=timeout_s, stdin=f, check=False)
        except subprocess.TimeoutExpired:
            log.warning("reading the step inside %s took over %.0fs: left to the order of writing", path, timeout_s)
            return None
        except OSError as exc:
            log.warning("could not start the reader of %s: %s", path, exc)
            return None
    if done.returncode != 0:
        log.debug("no step inside %s: %s", path, done.stderr.decode(errors="replace")[-500:])
        return None
    try:
        return step_in(json.loads(done.stdout.decode().strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return None


class StepReader:
    """Steps read from inside files, one at a time on a background thread, cached per version of a file."""

    def __init__(self, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BYTES) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._reads: dict[tuple[str, float, int], Future[int | None]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def step(self, root: Path, path: Path, wait: bool = False) -> int | None | object:
        """The step inside ``path``, a file under ``root`` (None: it names none); PENDING while it is being read,
        unless ``wait``."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_mtime, st.st_size)
        with self._lock:
            future = self._reads.get(key)
            if future is None:
                if len(self._reads) >= MAX_CACHED:  # a worker lives long: forget finished reads of old versions
                    self._reads = {k: f for k, f in self._reads.items() if not f.done()}
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="step-inside")
                future = self._pool.submit(read_step, root, path, self.timeout_s, self.max_bytes)
                self._reads[key] = future
        if not wait and not future.done():
            return PENDING
        return future.result()

    def busy(self) -> bool:
        """A read is under way: the next scan should come soon, not after the usual interval."""
        with self._lock:
            return any(not f.done() for f in self._reads.values())


READER = StepReader()  # one per worker process: every supervisor's scans share its cache and its one thread
