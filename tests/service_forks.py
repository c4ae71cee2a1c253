"""API processes forked from one that has already imported them.

Every API a test starts used to pay its imports (FastAPI, SQLAlchemy, SQLModel, pydantic, redis, and ours):
1.3-2 CPU-seconds a start, some 130 starts a run, on a 2-core machine where the suite is CPU-bound. One server
process per pytest process imports all of that once; each start is then a fork of it that becomes
``python -m api ...`` with the test's environment, working directory, log file and session, and runs that module's
``__main__`` as the interpreter would (``runpy``). Only the API is forked (FORKED).

What stays a real ``python -m`` start: a service started under a wrapper (setpriv, to run it as another user), one
whose ``PYTHON*`` variables differ from the server's (an interpreter reads them as it starts: import paths, buffering),
one whose /proc entries the test reads as an attacker would (``Services(fork=False)``: a fork's ``environ`` there is
its parent's), and every service with ``TORCHYARD_TEST_FORK_SERVICES=0``. The tests of the product's own start-up
(``make run``, the images, the Compose file) start it as a user does.

The forked service is the server's child, not pytest's: ``ForkedService`` is a ``subprocess.Popen`` whose poll and
wait ask the server, which reaps its children as they exit and keeps their status.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import resource
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The services' import paths: this checkout and its client (tests/helpers.py service_env sets the same).
SERVICE_PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "client")])
# TORCHYARD_TEST_FORK_SERVICES=0 starts every service cold, to tell a fault of the forks from one of the product.
ENABLED = os.environ.get("TORCHYARD_TEST_FORK_SERVICES", "1") != "0"
# What the services import, ours included: importing them here leaves each fork nothing but its own work. None of
# these reads the environment when imported (a fork's settings come from its own, read when it starts).
PRELOAD = ("api.app", "api.__main__")
# Forked: the API. Workers start as ``python -m worker``: with forked workers, sweep tests stalled in two runs of five.
# One stall was the sweep controller's (a promoted trial left held, since fixed, seen with every start cold too); the
# other, a task that never adopted its attempt, is not explained, so a worker's start stays the real one.
FORKED = ("api",)
OUR_PACKAGES = ("api", "worker", "jobs", "jobspec", "stack")


class ForkedService(subprocess.Popen):  # type: ignore[type-arg]
    """A Popen for a process the fork server started: signals go to its pid, its exit status comes from the server."""

    # Not Popen's __init__, which would start a process: the attributes its other methods read.
    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self._server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._waitpid_lock = threading.Lock()
        self._input = None
        self._communication_started = False
        self._child_created = False  # nothing for Popen.__del__ to reap: the server does
        self._sigint_wait_secs = 0.25
        self._closed_child_pipe_fds = True

    def _internal_poll(self, _deadstate: int | None = None, **_: Any) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.status(self.pid)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._internal_poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]


class ForkServer:
    """The pytest side: one server process, started at the first fork; requests are JSON lines, one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._file: Any = None
        self._last_cpu_s = 0.0
        self.env: dict[str, str] = {}  # the server's, once started: what its interpreter read when it started

    def _ensure(self) -> None:
        if self._proc is not None:
            return  # a server that died says so at the next request: its forks' statuses went with it
        ours, theirs = socket.socketpair()
        env = self.env = self.env or _server_env()
        # Its own session: a Ctrl+C at the terminal reaches pytest, which stops the services, and not the server.
        # Its output in a file, as a service's is: Python buffers a file's stdout as it would the service's own log file.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's for as long as it runs
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.service_forks", str(theirs.fileno())], cwd=ROOT,
                                      env=env, pass_fds=[theirs.fileno()], start_new_session=True,
                                      stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        theirs.close()
        self._file = ours.makefile("rwb", buffering=0)
        self._ask({"op": "hello"})

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            self._file.write(json.dumps(request).encode() + b"\n")
            line = self._file.readline()
        except OSError:
            line = b""
        if not line:
            self._log.seek(0)
            tail = self._log.read()[-4000:].decode(errors="replace")
            raise RuntimeError(f"the service fork server exited ({self._proc.poll() if self._proc else None}):\n{tail}")
        return json.loads(line)

    def spawn(self, module_args: list[str], env: dict[str, str], cwd: Path, log: Path) -> ForkedService:
        with self._lock:
            self._ensure()
            pid = self._ask({"op": "spawn", "args": module_args, "env": env, "cwd": str(cwd), "log": str(log)})["pid"]
        return ForkedService(self, pid, [sys.executable, "-m", *module_args])

    def status(self, pid: int) -> int | None:
        with self._lock:
            return self._ask({"op": "status", "pid": pid})["returncode"]

    def cpu_s(self) -> float:
        """CPU seconds of the server and of its forks that have exited: what pytest's own count of its reaped
        children (tests/slowest_files.py) no longer sees, since the forks are not pytest's. 0 before it starts."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                return self._last_cpu_s
            self._last_cpu_s = self._ask({"op": "cpu"})["cpu_s"]
            return self._last_cpu_s


SERVER = ForkServer()


def _server_env() -> dict[str, str]:
    """pytest's environment without torchyard's settings (each fork gets its own), with the services' import paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    return {**env, "PYTHONPATH": SERVICE_PYTHONPATH}


def _interpreter_settings(env: dict[str, str]) -> dict[str, str]:
    """What an interpreter reads from its environment as it starts (import paths, buffering, warnings, hash seed)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def usable(module: str, wrap: list[str], env: dict[str, str]) -> bool:
    """Whether this service can be forked here: one of FORKED, no wrapper, and the interpreter settings the server
    started with (see the module's docstring)."""
    return (ENABLED and module in FORKED and not wrap
            and _interpreter_settings(env) == _interpreter_settings(SERVER.env or _server_env()))


# The server's side, in its own process.

def _exited(status: dict[int, int]) -> None:
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status[pid] = os.waitstatus_to_exitcode(code)


def _become(request: dict[str, Any], control: socket.socket) -> int:
    """In the fork: the service that ``python -m MODULE ARGS`` would start, and its exit code."""
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    control.close()
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # the standard library's one cache of the environment (TMPDIR), read again on first use
    _clear_our_caches()
    module, *args = request["args"]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        sys.stderr.write(f"{exit_.code}\n")  # as the interpreter reports sys.exit(message)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
        traceback.print_exc()
        return 1
    return 0


def _clear_our_caches() -> None:
    """Anything of ours cached while importing (settings read from the environment above all) is the server's, not
    this service's: dropped, so it is read again from the fork's own."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in OUR_PACKAGES:
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


def serve(fd: int) -> int:
    """Answer requests until pytest closes its end; in a fork, return the service's exit code instead."""
    for name in PRELOAD:
        __import__(name)
    for name in [n for n in sys.modules if n.endswith(".__main__")]:
        del sys.modules[name]  # what they import stays; each fork runs its __main__ afresh, as ``-m`` does
    gc.freeze()  # the forks share these pages until they write them: a collection would touch every one
    control = socket.socket(fileno=fd)
    stream = control.makefile("rwb", buffering=0)
    status: dict[int, int] = {}
    signal.signal(signal.SIGCHLD, lambda *_: _exited(status))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while line := stream.readline():
        request = json.loads(line)
        if request["op"] == "spawn":
            # SIGCHLD held until a reused pid's old status is gone: a fork that exits at once must not find it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            pid = os.fork()
            if pid == 0:
                stream.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                return _become(request, control)
            status.pop(pid, None)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            answer: dict[str, Any] = {"pid": pid}
        elif request["op"] == "status":
            _exited(status)
            answer = {"returncode": status.get(request["pid"])}
        elif request["op"] == "cpu":
            own, forks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            answer = {"cpu_s": own.ru_utime + own.ru_stime + forks.ru_utime + forks.ru_stime}
        else:
            answer = {}
        stream.write(json.dumps(answer).encode() + b"\n")
    return 0


if __name__ == "__main__":
    # pytest gone, killed or not, closes its end of the socket: this returns, and its forks live on, as Popen's
    # children would. (Not a parent-death signal: that fires when the thread that started it ends.)
    sys.exit(serve(int(sys.argv[1])))
