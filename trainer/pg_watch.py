"""Notices a rank of a multi-rank job that never joins a process group of the job's world size.

A script that forgets ``init_process_group`` (or makes a group of one) runs every rank as a whole training
of its own: each sees all the data, they overwrite each other's files, and the job still exits 0. The rule:
under torchrun with WORLD_SIZE > 1,
a rank that ends without ``torch.distributed.init_process_group`` having returned a group of WORLD_SIZE
ranks leaves a note in its attempt's log directory; the worker names the job's ranks that did in its
final status (worker/supervisor.py). Torch-free until the script itself imports ``torch.distributed``:
``install`` adds an import hook that wraps ``init_process_group`` once that module has loaded.

Not seen by this rule: Accelerate (1.15) on CPUs without ``ACCELERATE_USE_CPU`` forms the group of the
world size and then trains each rank alone (``DistributedType.NO``); the worker sets that variable on
CPU-only placements (worker/devices.py) so it does not happen there.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from jobspec.rank_logs import NOTE_PREFIX, STEPS_MARK
from trainer.import_hooks import after_import

_seen: dict[str, int] = {"steps": 0}  # "world": the size of the group init_process_group returned; "steps": optimizer steps


def _wrap(module: ModuleType) -> None:
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_torchyard_watched", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            _seen["world"] = int(module.get_world_size())
        except Exception:  # noqa: BLE001 - watching must never break the script
            _seen["world"] = -1
        return result

    init_process_group._torchyard_watched = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    module.init_process_group = init_process_group  # type: ignore[attr-defined]
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None and getattr(c10d, "init_process_group", None) is original:
        c10d.init_process_group = init_process_group  # type: ignore[attr-defined]


def _count_step(*_args: Any) -> None:
    _seen["steps"] += 1


def _watch_steps(optimizer: ModuleType) -> None:
    """Whether the rank trained at all: torch's global hook after every optimizer step (Lightning's and the
    Trainer's included)."""
    with contextlib.suppress(Exception):  # watching must never break the script
        optimizer.register_optimizer_step_post_hook(_count_step)


def _note(log_dir: Path, rank: str, world: int) -> None:
    seen = _seen.get("world")
    if seen == world:
        return
    what = "never called init_process_group" if seen is None else f"joined a process group of {seen}"
    with contextlib.suppress(OSError):
        (log_dir / f"{NOTE_PREFIX}{rank}").write_text(f"rank {rank} of {world} {what}{STEPS_MARK}{_seen['steps']}\n",
                                                       encoding="utf-8")


def install(log_dir: Path | None = None) -> bool:
    """Watch this rank; True when it is a rank of a multi-rank torchrun job and the watch is on."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    rank = os.environ.get("RANK", "?")
    run_dir = os.environ.get("TORCHYARD_RUN_DIR")
    attempt = os.environ.get("TORCHYARD_ATTEMPT")
    if world <= 1 or (log_dir is None and not (run_dir and attempt)):
        return False
    target = log_dir or Path(run_dir or "") / "logs" / f"attempt-{attempt}"
    after_import("torch.distributed", _wrap)
    after_import("torch.optim.optimizer", _watch_steps)
    atexit.register(_note, target, rank, world)
    return True
