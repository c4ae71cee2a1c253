"""What ended an attempt: reads the torchrun error file and the logs, names the error type."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from jobs.store.models import ErrorType
from jobspec.exit_codes import PREEMPTED_EXIT_CODE, SPEC_ERROR_EXIT_CODE
from jobspec.rank_logs import OUTPUT_LOG, find_rank_dir, global_rank
from worker.sandbox.run_dirs import open_job_file, read_job_bytes

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 50


@dataclass(frozen=True)
class Failure:
    type: ErrorType
    message: str
    traceback: str | None
    exit_code: int | None
    log_tail: str | None = None
    rank: int | None = None
    # When the failing rank's own error file was written (ns since the epoch), where it left one: what tells the
    # first failure of a multi-node job from the errors its peers then raised on the connections it closed.
    written_ns: int | None = None


# torchrun's summary of a failed worker group names the root-cause rank and its error file.
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?error_file:\s*(\S*)", re.S)
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# The file torchrun has each rank write its error to (TORCHELASTIC_ERROR_FILE), in the rank's log directory.
_RANK_ERROR = "error.json"


def read_error_file(path: Path) -> tuple[str | None, str | None]:
    """(message, traceback) from a torchelastic error file, or (None, None)."""
    try:
        data = json.loads(read_job_bytes(path).decode("utf-8"))
    except (OSError, ValueError):
        return None, None
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return message.get("message"), extra.get("py_callstack")
    if isinstance(message, str):
        # A rank that died without @record leaves a plain string.
        return message, None
    return None, None


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with os.fdopen(open_job_file(path), "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def classify(exit_code: int | None, message: str | None, log_text: str) -> ErrorType:
    text = f"{message or ''}\n{log_text}"
    if exit_code == SPEC_ERROR_EXIT_CODE and "SpecError" in text:
        return ErrorType.SPEC
    if "OutOfMemoryError" in text or "out of memory" in text.lower():
        return ErrorType.OOM
    return ErrorType.TRAINING


# torch's own words for "this process has no CUDA": a CPU build of torch (the first two), a build with CUDA on a
# host without a driver or a visible GPU (the rest). A device fault on a host that has CUDA ("CUDA error:
# uncorrectable ECC error", "CUDA error: an illegal memory access") is none of these and is never rewritten.
_NO_CUDA = re.compile(
    r"module 'torch\._C' has no attribute '_cuda_\w+'"
    r"|Torch not compiled with CUDA enabled"
    r"|No CUDA GPUs are available"
    r"|Found no NVIDIA driver on your system"
    r"|no CUDA-capable device is detected"
    r"|ProcessGroupNCCL is only supported with GPUs, no GPUs found"
    r"|torch\.cuda\.is_available\(\) is False",
    re.IGNORECASE,
)
NO_CUDA_ADVICE = ("the script needs CUDA, but the host it ran on has none (no CUDA GPU, or a CPU build of torch); "
                  "to run it on a GPU host, ask for GPUs with `parallel.device: cuda` (or `parallel.nproc_per_node: gpu`, "
                  "one rank per GPU) in the job spec; the error was:")


def last_error(log_text: str) -> str:
    """The last traceback of a log and what follows it, else its last lines: the error, not the warnings before it
    (torch warns "Found no NVIDIA driver" at a mere is_available(), which fails nothing)."""
    start = log_text.rfind("Traceback (most recent call last)")
    return log_text[start:] if start >= 0 else "\n".join(log_text.splitlines()[-5:])


def no_cuda_message(summary: str, error: str) -> str:
    """``summary`` with what to do first when ``error`` (the rank's error, its traceback, the end of its log) is
    torch saying the process has no CUDA; unchanged otherwise (pure). The raw error stays, under the advice."""
    found = _NO_CUDA.search(error)
    if found is None or summary.startswith(NO_CUDA_ADVICE):
        return summary
    # torch's own line, when the summary does not carry it (a plain script's summary is only its exit code)
    line = error[error.rfind("\n", 0, found.start()) + 1:].split("\n", 1)[0].strip()
    return f"{NO_CUDA_ADVICE}\n{summary}" + ("" if line in summary else f"\n{line}")


def root_cause(launcher_text: str) -> tuple[int | None, Path | None]:
    """(global rank, directory of its logs) of the first failure torchrun observed."""
    match = _ROOT_CAUSE.search(launcher_text)
    if not match:
        return None, None
    error_file = match.group(2)
    return int(match.group(1)), (Path(error_file).parent if error_file and error_file != "<N/A>" else None)


def first_written(written_ns: Mapping[str, int]) -> str | None:
    """Of the ranks' error files (name -> when written, ns), the one written first; ties go to the lowest name in
    local-rank order (pure)."""
    return min(written_ns, key=lambda name: (written_ns[name], _local_order(name)), default=None)


def _local_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def first_of_nodes(failures: Sequence[Failure]) -> Failure | None:
    """Of each node's failure (node 0's first), the one whose rank wrote its error first, among those with a
    traceback; ties go to the lower node, a failure without a write time comes after every one with (pure). A rank
    writes its error file as it raises and closes its connections only as it exits, so its peers' errors about them
    are written later: on the runs volume every node shares, on clocks that agree to far better than that."""
    told = [(f.written_ns is None, f.written_ns or 0, node) for node, f in enumerate(failures) if f.traceback is not None]
    return failures[min(told)[2]] if told else None


def first_failure(rank: int | None, rank_dir: Path | None) -> tuple[int | None, Path | None]:
    """The rank of the same launch and restart whose error file was written first, in place of the one torchrun
    named. torchrun names the oldest error file by whole seconds, and, where it forks its ranks, the lowest local
    rank it finds dead at its poll: a rank that raised and a peer that failed on its closed connection a moment
    later both qualify. Each rank writes its file as it raises (@record), so the first written is the cause."""
    if rank_dir is None:
        return rank, rank_dir
    written: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for sibling in rank_dir.parent.iterdir():
            at = None if sibling.is_symlink() else _written_ns(sibling / _RANK_ERROR)
            if at is not None:
                written[sibling.name] = at
    first = first_written(written)
    if first is None or first == rank_dir.name:
        return rank, rank_dir
    chosen = rank_dir.parent / first
    try:
        return global_rank(chosen), chosen
    except (OSError, ValueError):
        return rank, rank_dir


def rank_exit_code(launcher_text: str) -> int | None:
    """The root-cause rank's own exit code as torchrun reported it (negative: killed by that signal)."""
    match = _ROOT_CAUSE.search(launcher_text)
    found = _EXITCODE.search(launcher_text, match.start(), match.end()) if match else None
    return int(found.group(1)) if found else None


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def failure(exit_code: int | None, error_file: Path, launcher_log: Path, default: ErrorType = ErrorType.TRAINING) -> Failure:
    launcher_tail = tail(launcher_log, 400)
    named, named_dir = root_cause(launcher_tail)
    rank, rank_dir = first_failure(named, named_dir)
    switched = rank_dir != named_dir
    # torchrun copied the error file of the rank it named to error_file; another rank's is read where it wrote it.
    message, traceback = read_error_file(rank_dir / _RANK_ERROR if switched and rank_dir else error_file)
    if rank_dir is None and rank is not None:
        # A rank without torchrun's @record (a plain script) leaves no error file: its own log says why.
        rank_dir = find_rank_dir(launcher_log.parent, rank)
    # output.log has the rank's stdout and stderr as printed, a native crash's last words included.
    rank_tail = (tail(rank_dir / OUTPUT_LOG) or tail(rank_dir / "stderr.log")) if rank_dir else ""
    log_tail = rank_tail or "\n".join(launcher_tail.splitlines()[-LOG_TAIL_LINES:])
    kind = classify(exit_code, message, log_tail)
    if kind is ErrorType.TRAINING:
        kind = default
    rank_code = None if switched else rank_exit_code(launcher_tail)  # the code torchrun gives is its own rank's
    if message and rank is not None:
        summary = f"rank {rank}: {message}"
    elif rank is not None and rank_code is not None:
        # torchrun's own code (1 whenever a rank fails) says less than the rank's: name both.
        summary = f"rank {rank} {_ended(rank_code)}" + (f"; torchrun exited with code {exit_code}" if exit_code is not None else "")
    elif rank is not None:
        summary = f"rank {rank}: torchrun exited with code {exit_code}"
    else:
        summary = message or f"torchrun exited with code {exit_code}"
    summary = no_cuda_message(summary, "\n".join(t for t in (message, traceback, last_error(log_tail)) if t))
    return Failure(type=kind, message=summary, traceback=traceback, exit_code=exit_code, log_tail=log_tail or None, rank=rank,
                   written_ns=_written_ns(rank_dir / _RANK_ERROR) if rank_dir else None)


def _written_ns(error_file: Path) -> int | None:
    """When a rank's error file was written; None for none, or for a link, which no rank writes."""
    try:
        return None if error_file.is_symlink() or not error_file.is_file() else error_file.stat().st_mtime_ns
    except OSError:
        return None


def was_preempted(exit_code: int | None, last_phase: str | None) -> bool:
    """The trainer saved and stopped on SIGTERM: requeue rather than fail."""
    return last_phase == "preempted" or exit_code == PREEMPTED_EXIT_CODE
