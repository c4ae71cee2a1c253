"""``python -m trainer.rank_bootstrap CODE_ROOT KIND TARGET [ARGS...]``: how a script job's rank starts.

KIND and TARGET, as the worker resolved the entrypoint just before launch:

* ``file PATH``: a ``.py`` file under the code root (PATH resolved, symlinks included);
* ``module NAME PATH``: a module under the code root, and the file it resolved to (``NAME.py``,
  or ``NAME/__main__.py`` for a package);
* ``installed NAME``: an installed module the operator allow-listed (TORCHYARD_SCRIPT_MODULES).

torchrun starts this module on every rank of a ``kind: script`` job instead of the user's
entrypoint, so that before any of the user's code runs:

* the rank's output is interleaved (trainer.rank_output): stdout and stderr in one file as printed,
  a copy per stream, and the node's merged log; before the rest, so even a failure below is in it;
* a rank of a multi-rank job is watched for joining a process group of the job's world size
  (trainer.pg_watch), and the worker's own ``rich`` is hidden unless the job's requirements name it
  (trainer.leaks): Lightning would otherwise draw a bar that shows nothing in a log; and ``torch.load`` onto
  an indexed CPU device (``cpu:0``, Accelerate's device for CPU ranks) works (trainer.cpu_locations);
* first of all, the rank gets the parent-death signal, like catalog ranks: it dies with torchrun instead
  of holding a GPU after its launcher is gone, and exits at once if torchrun died while it started
  (jobspec.pdeathsig.die_with_parent);
* the run directory (the working directory) is not on ``sys.path``: the worker starts the ranks
  with ``PYTHONSAFEPATH=1``, and the entry is dropped here as well for interpreters without it;
* the code root comes first on ``sys.path`` (and on ``PYTHONPATH`` for processes the script
  starts), so the script imports its sibling modules; a ``.py`` entrypoint's own directory
  precedes it, as ``python FILE`` would put it. CODE_ROOT is an argument, not the environment:
  the worker's TORCHYARD_* settings do not reach the ranks. It is the job's unpacked bundle
  (``runs/<id>/code``) for a job with ``code``, else the service's code root;
* the modules this bootstrap imported for itself (the ``trainer`` package) and, for ``module``,
  those of the entry's top-level package are forgotten unless they come from the code root, so
  the user's code imports its own ``trainer.py`` or ``trainer/`` as ``python FILE`` would, and a
  bundle cannot make the rank run one of torchyard's modules (this one included) on its args;
* a ``module`` entrypoint must resolve, from here, to exactly the file the worker resolved; a rank
  that would run anything else stops with a message saying so.

Then the entrypoint runs as ``python FILE ARGS`` or ``python -m MODULE ARGS`` would run it
(``runpy``), with ``sys.argv`` set the same way. Torch-free, and importing nothing of the user's
before the entrypoint itself.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pkgutil  # noqa: F401  (runpy imports it lazily: loaded now, the code root cannot stand in for it)
import runpy
import sys
import threading
from typing import NoReturn

from jobspec.pdeathsig import die_with_parent

if __name__ == "__main__":
    die_with_parent()  # before anything else is imported: the window in which torchrun's death goes unseen

from jobspec.exit_codes import exit_status  # noqa: E402
from jobspec.paths import within  # noqa: E402
from trainer import cpu_locations, leaks, pg_watch  # noqa: E402
from trainer.rank_output import interleave  # noqa: E402

USAGE = "usage: python -m trainer.rank_bootstrap CODE_ROOT file PATH|module NAME PATH|installed NAME [ARGS...]"
OWN_PACKAGE = "trainer"  # this module's package, and the SDK's: what a user's own trainer.py would clash with


def _set_path(code_root: str, script_dir: str | None) -> None:
    # PYTHONSAFEPATH keeps the working directory off sys.path from 3.11; older interpreters put it first.
    cwd = os.getcwd()
    kept = [p for p in sys.path if p not in ("", cwd, code_root, script_dir)]
    sys.path[:] = [p for p in (script_dir, code_root) if p] + kept
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = code_root + (os.pathsep + inherited if inherited else "")


def _inside(path: str | None, root: str) -> bool:
    return path is not None and within(path, root)


def forget_outside(packages: set[str], code_root: str) -> None:
    """Drop from sys.modules every module of these top-level packages that does not come from the code root,
    so the next import finds what sys.path (the code root first) says, not what this process loaded before."""
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] not in packages or name in sys.builtin_module_names:
            continue
        locations = [getattr(module, "__file__", None), *list(getattr(module, "__path__", None) or [])]
        if not any(_inside(p, code_root) for p in locations):
            del sys.modules[name]
    importlib.invalidate_caches()


def module_file(name: str) -> str | None:
    """The file ``python -m name`` would run (``__main__.py`` of a package), resolved; None when there is none."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return os.path.realpath(spec.origin)


def main(argv: list[str] | None = None) -> None:
    interleave()  # first: everything below, and everything the entrypoint prints, lands in output.log in order
    pg_watch.install()  # a rank of a multi-rank job that never joins the process group is named in the job's status
    cpu_locations.install()  # torch.load onto "cpu:0", as Accelerate's CPU ranks ask, restores (trainer/cpu_locations.py)
    leaks.hide()  # the worker's own rich would make Lightning draw a bar that shows nothing in a log (trainer/leaks.py)
    argv = sys.argv[1:] if argv is None else argv
    kind = argv[1] if len(argv) > 1 else None
    if kind not in ("file", "module", "installed") or len(argv) < (4 if kind == "module" else 3):
        raise SystemExit(USAGE)
    code_root, target = argv[0], argv[2]
    expected, args = (argv[3], argv[4:]) if kind == "module" else (None, argv[3:])
    if kind == "file":
        _set_path(code_root, os.path.dirname(target))
        forget_outside({OWN_PACKAGE}, code_root)
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")
        return
    _set_path(code_root, None)
    forget_outside({OWN_PACKAGE, target.partition(".")[0]} if kind == "module" else {OWN_PACKAGE}, code_root)
    if kind == "module":
        found = module_file(target)
        if found != os.path.realpath(expected or ""):
            raise SystemExit(f"torchyard: entrypoint {target!r} resolves to {found or 'nothing'} here, not to {expected} "
                             "as the worker resolved it; not running it")
    sys.argv = [target, *args]
    runpy.run_module(target, run_name="__main__", alter_sys=True)


def finish(code: object = 0) -> NoReturn:
    """End a rank whose code returned (or raised SystemExit) as ``python`` would: non-daemon threads joined, atexit
    handlers run, output flushed, the exit status kept; but without the interpreter's teardown, where gloo's threads
    releasing their last work objects can abort a finished rank ("terminate called without an active exception",
    SIGABRT after the script's last line), which torchrun would report as a failure."""
    status = exit_status(code)  # SystemExit("message"): python prints it and exits 1
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exc:
        finish(exc.code)
    finish(0)
