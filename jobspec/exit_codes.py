"""Exit codes the worker reads from a finished trainer, and how a rank exits. Torch-free so the worker can import it."""

import logging
import os
import sys
from typing import NoReturn

# Every rank exits with this code after a SIGTERM led to a saved checkpoint: "preempted, requeue
# and resume". 75 is EX_TEMPFAIL in sysexits.h; it differs from 143 (128 + SIGTERM), which is what
# a rank killed by SIGTERM before it could save would report.
PREEMPTED_EXIT_CODE = 75

# A sweep trial's pause (jobs/sweeps): the worker sets PAUSE_AT_ENV to "steps:N" or "epochs:N", the rung the trial
# may train to. The ranks stop there by themselves, with a checkpoint and an evaluation at that step, say
# PAUSED_PHASE and exit 0 (a non-zero exit would make torchrun restart them); the worker puts the job back in line,
# held for the sweep's decision.
PAUSE_AT_ENV = "TORCHYARD_PAUSE_AT"
PAUSED_PHASE = "paused"

# The spec could not be loaded or checked (a bad file, a path outside the data root, ...).
SPEC_ERROR_EXIT_CODE = 2


def flush_output() -> None:
    """Every log record and every line written so far out, before a rank ends without the interpreter's teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()


def exit_status(code: object) -> int:
    """The exit status python gives ``SystemExit(code)``: None is 0, an int itself, anything else is printed to
    stderr and is 1."""
    if code is None or isinstance(code, int):
        return code or 0
    sys.stderr.write(f"{code}\n")
    return 1


def exit_now(code: int) -> NoReturn:
    """End a rank whose work is written and closed and whose groups are destroyed, skipping the interpreter's
    teardown: there gloo's threads releasing their last work objects can still abort a finished rank (SIGABRT after
    "done", "terminate called without an active exception", seen on loaded hosts)."""
    flush_output()
    os._exit(code)
