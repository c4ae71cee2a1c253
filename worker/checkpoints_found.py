"""Checkpoints the frameworks write by themselves, found in a job's directory.

- Lightning: ``*.ckpt`` files (``epoch=3-step=400.ckpt``, ``last.ckpt``); the step from ``step=N`` in the
  name, else the file's own ``global_step`` (worker/step_inside.py).
- Hugging Face Trainer: ``checkpoint-N/`` directories; complete once ``trainer_state.json`` is there (the
  Trainer writes it last), the step its ``global_step``.
- Accelerate ``save_state``: a directory with ``random_states_0.pkl`` beside the model or optimizer files
  (``checkpoint_N/`` under automatic naming); the step the directory name's number.
- The spec's ``checkpoint.discover`` globs (``out/*.pt``), matched in the script's working directory (where it
  runs and writes ``out/ckpt.pt``): files or directories; the step the last number in the name, else for a
  file the ``global_step``, ``iter_num``, ``step`` or ``epoch`` inside it (worker/step_inside.py), else none:
  such a checkpoint is ordered by when it was written.

Only complete ones count: nothing in them modified for SETTLE_S, newer than the job (an uploaded
pretrained file is not the job's checkpoint), and a file ``torch.save`` wrote has its zip end record (a
rank killed mid-save leaves a file that stops changing but is not whole). What is read of them is read as the metric
files are (worker/run_files.py ``open_in``): a link swapped in is not followed, and a FIFO is no checkpoint.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from jobs.code_bundles.files import CODE_DIR_NAME
from worker import step_inside
from worker.run_files import open_in

log = logging.getLogger(__name__)

SETTLE_S = 1.0
SKIP_DIRS = frozenset({"logs", ".git", ".venv", "venv", "site-packages", "__pycache__", "node_modules", ".cache"})
MAX_WALK = 20_000
MAX_FOUND = 1_000
_STEP = re.compile(r"(?:^|[^a-z])step[=_-]?(\d{1,12})", re.IGNORECASE)
HF_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d{1,12})$")
TRAINER_STATE = "trainer_state.json"  # the Hugging Face Trainer writes it last into each checkpoint-N/
_NUMBER = re.compile(r"(\d{1,12})")
_ACCELERATE_MODEL = ("model.safetensors", "pytorch_model.bin", "optimizer.bin")
MAX_TRAINER_STATE = 64 << 20  # its log_history grows with the run: a longer one is not JSON that ends, and names no step


@dataclass(frozen=True)
class FoundCkpt:
    path: Path  # absolute
    kind: str  # lightning | huggingface | accelerate | glob
    step: int | None
    mtime: float  # newest modification inside it


def step_from_name(name: str, kind: str) -> int | None:
    """The step a checkpoint's name says, when it says one (pure)."""
    if (m := _STEP.search(name)) is not None:
        return int(m.group(1))
    if kind == "huggingface" and (m := HF_CHECKPOINT_DIR.match(name)) is not None:
        return int(m.group(1))
    if kind in ("accelerate", "glob"):
        stem = name.split(".", 1)[0] if kind == "glob" else name
        numbers = _NUMBER.findall(stem)
        return int(numbers[-1]) if numbers else None
    return None


def _newest(path: Path) -> float | None:
    """The newest mtime of ``path`` and, for a directory, of everything in it (None when it vanished)."""
    try:
        newest = path.stat().st_mtime
        if path.is_dir():
            for dirpath, _dirs, files in os.walk(path):
                for name in files:
                    newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
        return newest
    except OSError:
        return None


def whole_zip(root: Path, path: Path) -> bool:
    """False for a zip file (what ``torch.save`` writes) without its end record: cut off mid-write by a kill,
    however long ago. A file in another format passes (nothing cheap to check). Opened as every file of the job's
    is (worker/run_files.py open_in): no link followed, a FIFO refused."""
    try:
        with open_in(root, path) as f:
            if f.read(4) != b"PK\x03\x04":
                return True
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 65_557))  # the end record is in the last 22 bytes plus at most a 64 KiB comment
            return b"PK\x05\x06" in f.read()
    except OSError:
        return False


def _hf_step(root: Path, path: Path) -> int | None:
    try:
        with open_in(root, path / TRAINER_STATE) as f:
            step = json.loads(f.read(MAX_TRAINER_STATE)).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and step >= 0 else None


def _classify_dir(path: Path, names: set[str]) -> str | None:
    if HF_CHECKPOINT_DIR.match(path.name) and TRAINER_STATE in names:
        return "huggingface"
    if "random_states_0.pkl" in names and any(n in names for n in _ACCELERATE_MODEL):
        return "accelerate"
    return None


def _walk(root: Path) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    pending, seen = [root], 0
    while pending and seen < MAX_WALK and len(found) < MAX_FOUND:
        here = pending.pop(0)
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        seen += len(entries)
        kind = _classify_dir(here, {e.name for e in entries}) if here != root else None
        if kind is not None:
            found.append((here, kind))
            continue  # a checkpoint directory's own files are not checkpoints of their own
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    # The unpacked upload is read-only to the job: a pretrained .ckpt shipped in it is not its checkpoint.
                    if entry.name not in SKIP_DIRS and not (here == root and entry.name == CODE_DIR_NAME):
                        pending.append(Path(entry.path))
                elif entry.name.endswith(".ckpt") and entry.is_file(follow_symlinks=False):
                    found.append((Path(entry.path), "lightning"))
            except OSError:
                continue
    return found


def _globbed(root: Path, patterns: list[str]) -> list[tuple[Path, str]]:
    """What ``patterns`` match relative to ``root`` (the script's working directory), never outside it."""
    real_root = root.resolve()
    found = []
    for pattern in patterns:
        try:
            for path in sorted(itertools.islice(root.glob(pattern), MAX_FOUND)):
                # A regular file or a directory: a FIFO or device the job put there is no checkpoint.
                plain = not path.is_symlink() and (path.is_file() or path.is_dir())
                if plain and path.resolve().is_relative_to(real_root):
                    found.append((path, "glob"))
        except (OSError, ValueError) as exc:
            log.warning("checkpoint.discover %r: %s", pattern, exc)
    return found


def discover(root: Path, patterns: list[str], now: float, since: float = 0.0, settle_s: float = SETTLE_S,
             glob_root: Path | None = None, wait: bool = True) -> list[FoundCkpt]:
    """Complete checkpoints under ``root``, oldest first; ``since``: only those written after it (the job's start).
    ``patterns`` are matched relative to ``glob_root`` (default ``root``). A file whose step is still being read
    from inside is left for a later scan unless ``wait``."""
    seen: dict[Path, FoundCkpt] = {}
    for path, kind in [*_walk(root), *_globbed(glob_root or root, patterns)]:
        if path in seen:
            continue
        newest = _newest(path)
        if newest is None or newest > now - settle_s or newest < since:
            continue
        if kind == "huggingface":
            step = _hf_step(root, path)
            if step is None:
                continue  # trainer_state.json is written last; unreadable, it is not there yet
        else:
            if path.is_file() and not whole_zip(root, path):
                continue
            step = step_from_name(path.name, kind)
            if step is None and path.is_file():
                inside = step_inside.READER.step(root, path, wait=wait)
                if inside is step_inside.PENDING:
                    continue
                step = inside if isinstance(inside, int) else None
        seen[path] = FoundCkpt(path, kind, step, newest)
    return sorted(seen.values(), key=lambda c: (c.mtime, c.step if c.step is not None else -1))


def latest(found: list[FoundCkpt]) -> FoundCkpt | None:
    """The checkpoint a resuming attempt starts from: the newest complete one (the highest step among equals)."""
    return found[-1] if found else None
