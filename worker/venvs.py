"""Per-job Python environments for a script job's ``requirements``.

One virtual environment per distinct requirement list (and worker Python, torch version and install
policy), cached under ``TORCHYARD_VENVS_DIR`` (default ``RUNS_DIR/.venvs``, which every worker sees, so
the nodes of a multi-node job and later jobs use the one environment). It is layered over the worker's
own environment: ``--system-site-packages``, plus the worker's site directories when the worker itself
runs in a virtual environment, so torch and everything else installed there is used, never reinstalled
(a constraints file pins torch to the worker's version: a requirement that wants another torch fails).

Built once: under a file lock, into a directory of its own that never moves (a venv's scripts name
their absolute path), committed by atomically renaming a symlink ``<key>`` onto it. A build that
fails or dies leaves no ``<key>``; the next job builds afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jobs.settings import Settings
from jobspec.requirements import canonical
from worker import torch_builds

log = logging.getLogger(__name__)

READY = ".torchyard-ready"
_POLL_S = 0.5
_MESSAGE_LINES = 30


class SetupFailed(Exception):
    """The environment could not be built; the message carries pip's own words."""

    def __init__(self, message: str, log_tail: str | None = None):
        super().__init__(message)
        self.log_tail = log_tail


class SetupInterrupted(Exception):
    """The job was cancelled, preempted or lost while its environment was being built."""


def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def env_key(settings: Settings, requirements: list[str]) -> str:
    basis = {
        "requirements": canonical(requirements), "python": sys.version, "executable": os.path.realpath(sys.executable),
        "torch": _torch_version(), "only_binary": settings.requirements_only_binary,
        "torch_index": torch_builds.index_url(settings),
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:24]


def _ready(link: Path) -> Path | None:
    """The environment's real directory once it is complete."""
    return link.resolve() if (link / READY).is_file() else None


def interpreter(settings: Settings, requirements: list[str]) -> str:
    """The Python a job's torchrun and ranks run: its requirements environment's, else the worker's own."""
    if not requirements:
        return sys.executable
    venv = _ready(settings.venvs_root / env_key(settings, requirements))
    if venv is None:
        raise SetupFailed("the job's requirements environment is not built on this worker")
    return str(venv / "bin" / "python")


def env_vars(settings: Settings, requirements: list[str], base_path: str) -> dict[str, str]:
    """VIRTUAL_ENV and PATH for the ranks of a job with requirements (its console scripts come first)."""
    if not requirements:
        return {}
    venv = Path(interpreter(settings, requirements)).parent.parent
    return {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{base_path}"}


@contextlib.contextmanager
def _locked(path: Path, keep_going: Callable[[], bool]) -> Iterator[None]:
    """An exclusive lock on one open file (flock: held against other opens in this process too; on NFS
    Linux maps it to a byte-range lock that other hosts see), waited for without blocking heartbeats."""
    with path.open("a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if not keep_going():
                    raise SetupInterrupted from None
                time.sleep(_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _worker_site_dirs() -> list[str]:
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def _pip_env() -> dict[str, str]:
    # The worker's settings carry credentials (database URL, tokens): never hand them to pip or a build.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update({"PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"})
    return env


def _run(cmd: list[str], log_file: Path, deadline: float, keep_going: Callable[[], bool]) -> None:
    with log_file.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=_pip_env(),
                                start_new_session=True)
    try:
        while proc.poll() is None:
            if not keep_going():
                raise SetupInterrupted
            if time.monotonic() > deadline:
                raise SetupFailed("installing requirements took longer than TORCHYARD_REQUIREMENTS_TIMEOUT_S; stopped")
            time.sleep(_POLL_S)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        tail = _tail(log_file)
        raise SetupFailed(f"pip install failed (exit {proc.returncode}): {_pip_error(tail)}", tail)


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-_MESSAGE_LINES:])


def _pip_error(tail: str) -> str:
    """pip's own explanation: its ERROR lines, else the last line it printed."""
    errors = [line.strip() for line in tail.splitlines() if line.startswith("ERROR")]
    return " ".join(errors) if errors else (tail.splitlines()[-1].strip() if tail.strip() else "no output")


# What pip says when --only-binary=:all: leaves a requirement (or one of its dependencies) without a candidate.
_NO_WHEEL = ("No matching distribution found", "Could not find a version that satisfies")
ONLY_BINARY_SETTING = "TORCHYARD_REQUIREMENTS_ONLY_BINARY"


def wheels_only_hint(message: str, only_binary: bool) -> str:
    """pip's failure, plus, when wheels only may be the cause, the operator setting that allows source builds."""
    if not only_binary or not any(words in message for words in _NO_WHEEL):
        return message
    return (f"{message} (this service installs requirements from wheels only; a package, or one of its dependencies, "
            f"that publishes no wheel for this platform needs the operator to set {ONLY_BINARY_SETTING}=false, "
            "which runs its build script on the worker)")


def _build(settings: Settings, requirements: list[str], build: Path, log_file: Path, deadline: float,
           keep_going: Callable[[], bool]) -> None:
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(build)], log_file, deadline, keep_going)
    python = build / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, env=_pip_env(), timeout=120).stdout.strip()
    # Layer the worker's own site directories (a worker in a venv has torch there, not in the system's):
    # processed with their .pth files, after the job's own packages, so those win.
    lines = [f"import site; site.addsitedir({d!r})" for d in _worker_site_dirs()]
    Path(purelib, "_torchyard_worker_site.pth").write_text("\n".join(lines) + "\n")
    constraints = build / "constraints.txt"
    torch = _torch_version()
    constraints.write_text(f"torch=={torch}\n" if torch else "")
    cmd = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
           "-c", str(constraints)]
    if settings.requirements_only_binary:
        cmd.append("--only-binary=:all:")
    # Builds of the worker's torch (torchvision+cpu ...) come from its index; checked below against what pip chose.
    index = torch_builds.index_url(settings)
    if index:
        cmd += ["--extra-index-url", index]
    report = build / "pip-report.json"
    cmd += ["--report", str(report)]
    try:
        _run([*cmd, *canonical(requirements)], log_file, deadline, keep_going)
    except SetupFailed as exc:
        raise SetupFailed(wheels_only_hint(str(exc), settings.requirements_only_binary), exc.log_tail) from None
    problems = torch_builds.mismatches(json.loads(report.read_text()).get("install", []), torch) if torch else []
    if problems:
        raise SetupFailed(torch_builds.refusal(problems, index), _tail(log_file))
    (build / READY).write_text(json.dumps({"requirements": canonical(requirements), "built_at": time.time()}))


def ensure(settings: Settings, requirements: list[str], log_file: Path, keep_going: Callable[[], bool]) -> str | None:
    """Build the environment of ``requirements`` unless it exists; its Python, or None without requirements.

    ``keep_going`` is called about twice a second while waiting (heartbeat there; False stops the
    build: SetupInterrupted). pip's output goes to ``log_file``. SetupFailed says why it failed."""
    if not requirements:
        return None
    root = settings.venvs_root
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(settings, requirements)
    link = root / key
    if _ready(link) is None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + settings.requirements_timeout_s
        with _locked(root / f"{key}.lock", keep_going):
            if _ready(link) is None:  # another job may have built it while we waited
                build = root / f"{key}-{secrets.token_hex(4)}"
                started = time.monotonic()
                try:
                    _build(settings, requirements, build, log_file, deadline, keep_going)
                    tmp_link = root / f".{key}-{secrets.token_hex(4)}"
                    os.symlink(build.name, tmp_link)
                    os.replace(tmp_link, link)  # the commit: from here on every job finds it
                except BaseException:
                    shutil.rmtree(build, ignore_errors=True)
                    raise
                log.info("built requirements environment %s in %.1fs", key, time.monotonic() - started)
    return interpreter(settings, requirements)
