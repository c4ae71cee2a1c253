"""What a job's ranks leave in their attempt's log directory, as the worker and the API read it back.

The ranks write these files (trainer/rank_output.py: each rank's ``output.log``, its ``rank`` mark and the node's
merged ``ranks.log``; trainer/pg_watch.py: a note per rank that never joined a process group of the job's world
size); the API serves them (jobs/reads/artifacts.py, jobs/reads/job_logs.py) and the worker reads them for a job's
verdict (worker/outcome.py, worker/supervisor.py). Their names and the reading are here, so neither side imports the
other's.
"""

from __future__ import annotations

import re
from pathlib import Path

OUTPUT_LOG = "output.log"
MERGED_LOG = "ranks.log"
RANK_MARK = "rank"
_RESTART = re.compile(r"attempt_(\d+)$")
NOTE_PREFIX = "no-process-group.rank-"  # one file per rank that never joined, in logs/attempt-N/
STEPS_MARK = "; optimizer steps in this process: "


def merged_log_name(node: int) -> str:
    return MERGED_LOG if node == 0 else f"ranks-node-{node}.log"


def merged_line_prefix(rank: int | str) -> bytes:
    """What starts each of a rank's lines in its node's merged log."""
    return f"[rank {rank}] ".encode()


def global_rank(rank_dir: Path) -> int:
    """The global rank whose logs ``rank_dir`` holds: its ``rank`` mark, or for a rank that died before writing one,
    its local rank (the directory's name), which equals the global rank on one node. A mark that is a link is not
    read. OSError or ValueError when neither says."""
    mark = rank_dir / RANK_MARK
    return int(mark.read_text()) if mark.is_file() and not mark.is_symlink() else int(rank_dir.name)


def find_rank_dir(log_dir: Path, rank: int) -> Path | None:
    """The directory of global rank ``rank``'s logs under torchrun's ``--log-dir`` of one attempt:
    ``<log dir>/<run id>/attempt_<restart>/<local rank>``, of the newest launch and its highest restart.

    A directory whose ``rank`` mark names another global rank is not it (node 1's local rank 0 is global
    rank ``nproc_per_node``); one without a mark (a rank that died before writing it) counts under its
    local rank, which equals the global rank on one node. Names only, no symlink followed."""
    if log_dir.is_symlink() or not log_dir.is_dir():
        return None
    candidates = []
    for rank_dir in log_dir.glob("*/attempt_*/*"):
        restart = _RESTART.match(rank_dir.parent.name)
        if not restart or rank_dir.is_symlink() or not rank_dir.is_dir():
            continue
        try:
            owner = global_rank(rank_dir)
            launched = rank_dir.parent.parent.lstat().st_mtime
        except (OSError, ValueError):
            continue
        if owner == rank:
            # One torchrun run-id directory per node and launch: the newest launch, then its highest restart.
            candidates.append((launched, int(restart.group(1)), rank_dir))
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def process_group_warning(log_dir: Path) -> str | None:
    """What the job's status says when ranks of this attempt left notes (None when none did)."""
    try:
        notes = sorted(p for p in log_dir.iterdir() if p.name.startswith(NOTE_PREFIX))
    except OSError:
        return None
    if not notes:
        return None
    texts = [p.read_text(encoding="utf-8", errors="replace").strip() for p in notes]
    first = texts[0].split(STEPS_MARK)[0][:200]
    said = f"warning: {len(notes)} rank(s) never formed a process group of the job's world size ({first})"
    if all(t.endswith(f"{STEPS_MARK}0") for t in texts):
        # Not one optimizer step: nothing says these ranks trained, alone or otherwise.
        return (f"{said} and took no optimizer step in their own process: the script may have trained nothing. Usual "
                "cause: a script that starts processes of its own, such as mp.spawn(nprocs=torch.cuda.device_count()), "
                "which starts none on a host without GPUs")
    return (f"{said}: each probably trained alone on all the data. Usual causes: a script without init_process_group "
            "(torchrun only starts the processes); a script written for torch.distributed.launch, which reads its rank "
            "from --local_rank (add \"--local_rank=${local_rank}\" to args: torchrun puts each rank's own there); or a "
            "framework told to run one process (Accelerate's num_processes, a Trainer's devices=1)")
