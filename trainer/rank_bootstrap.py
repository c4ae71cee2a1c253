"""``python -m trainer.rank_bootstrap CODE_ROOT file|module TARGET [ARGS...]``: how a script job's rank starts.

torchrun starts this module on every rank of a ``kind: script`` job instead of the user's
entrypoint, so that before any of the user's code runs, in this order:

* the rank's output is interleaved (trainer.rank_output): stdout and stderr in one file as printed,
  a copy per stream, and the node's merged log; first, so even a failure below is in it;
* the rank gets the parent-death signal, like catalog ranks: it dies with torchrun instead of
  holding a GPU after its launcher is gone;
* the run directory (the working directory) is not on ``sys.path``: the worker starts the ranks
  with ``PYTHONSAFEPATH=1``, and the entry is dropped here as well for interpreters without it;
* the code root comes first on ``sys.path`` (and on ``PYTHONPATH`` for processes the script
  starts), so the script imports its sibling modules; a ``.py`` entrypoint's own directory
  precedes it, as ``python FILE`` would put it. CODE_ROOT is an argument, not the environment:
  the worker's TORCHYARD_* settings do not reach the ranks. It is the job's unpacked bundle
  (``runs/<id>/code``) for a job with ``code``, else the service's code root.

Then the entrypoint runs as ``python FILE ARGS`` or ``python -m MODULE ARGS`` would run it
(``runpy``), with ``sys.argv`` set the same way. The worker resolved TARGET under the code root
(or the operator's allow-list) just before launch. Torch-free, and importing nothing of the
user's before the entrypoint itself.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from trainer.pdeathsig import set_parent_death_signal
from trainer.rank_output import interleave

USAGE = "usage: python -m trainer.rank_bootstrap CODE_ROOT file|module TARGET [ARGS...]"


def _set_path(code_root: str, script_dir: str | None) -> None:
    # PYTHONSAFEPATH keeps the working directory off sys.path from 3.11; older interpreters put it first.
    cwd = os.getcwd()
    kept = [p for p in sys.path if p not in ("", cwd, code_root, script_dir)]
    sys.path[:] = [p for p in (script_dir, code_root) if p] + kept
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = code_root + (os.pathsep + inherited if inherited else "")


def main(argv: list[str] | None = None) -> None:
    interleave()  # first: everything below, and everything the entrypoint prints, lands in output.log in order
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] not in ("file", "module"):
        raise SystemExit(USAGE)
    code_root, kind, target, args = argv[0], argv[1], argv[2], argv[3:]
    # Before the entrypoint's imports: a rank must not outlive torchrun.
    if sys.platform.startswith("linux") and not set_parent_death_signal(signal.SIGKILL):
        sys.stderr.write("torchyard: cannot set the parent-death signal; a killed torchrun may leave this rank running\n")
    sys.argv = [target, *args]
    if kind == "file":
        _set_path(code_root, os.path.dirname(target))
        runpy.run_path(target, run_name="__main__")
    else:
        _set_path(code_root, None)
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
