"""A script job's working directory: a writable copy of its code, ``runs/<id>/workdir``, where its ranks start,
so a repository that reads ``config/`` or ``data/`` relative to its root, or writes beside its own files, runs
as ``python train.py`` would from the user's checkout. The run directory around it keeps logs and events.

What is copied: the job's uploaded directory (its read-only ``code/``, already checked by jobs/code_bundles/files.py), or
without a bundle the entry of ``TORCHYARD_CODE_DIR`` that holds the entrypoint (``nanogpt/`` for
``nanogpt/train.py``; the whole code root for a file or module at its top), at the same relative path, so the
entrypoint resolves in the copy as it did at submission. An installed module gets an empty directory.

The copy is made once per job and reused by every attempt (a framework resuming finds what it wrote), and by
every node of a multi-node job on shared storage. It is made by the worker in a private temporary directory,
renamed into place, then handed to the job's uid with the rest of the run directory (worker/sandbox/run_dirs.py); the
bundles directory and ``code/`` stay read-only. ``workdir.json`` records the uploaded files, so the API lists only
what the job wrote (jobs/reads/workdir_files.py). Modification times are kept: an uploaded ``*.ckpt`` or event file
is older than the job, and so never taken for one of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
from pathlib import Path

from jobs.code_bundles import files as bundles
from jobs.reads.workdir_files import MANIFEST_NAME, WORKDIR_NAME, Uploaded, manifest_json
from jobs.settings import Settings
from jobspec.spec import ScriptJobSpec, resolve_entrypoint
from worker.venvs import SetupFailed

log = logging.getLogger(__name__)


def _source(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> tuple[Path | None, str]:
    """What to copy and where it goes under the working directory ('' for its root): None copies nothing."""
    if spec.code is not None:
        return run_dir / bundles.CODE_DIR_NAME, ""
    root = settings.code_dir.resolve()
    try:
        entry = resolve_entrypoint(spec.entrypoint, root, frozenset(settings.script_modules))
    except ValueError as exc:
        raise SetupFailed(f"entrypoint {spec.entrypoint!r}: {exc}") from exc
    if entry.file is None:
        return None, ""  # an installed module: nothing of the code root is the job's
    top = entry.file.relative_to(root).parts[0]
    if (root / top).is_dir() and not (root / top).is_symlink():
        return root / top, top
    return root, ""


def _uploaded(copy: Path) -> Uploaded:
    files: Uploaded = {}
    for dirpath, _dirs, names in os.walk(copy):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                files[Path(dirpath, name).relative_to(copy).as_posix()] = (st.st_size, st.st_mtime_ns)
    return files


def _writable(copy: Path) -> None:
    """The copy keeps the source's modes (0555/0444 for a bundle) plus the owner's write: the job changes it."""
    for dirpath, dirs, names in os.walk(copy):
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | 0o700)
        for name in names:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) | 0o600)
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # chmod keeps mtime; said so the record holds
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]


def _too_large(source: Path, limit: int) -> int | None:
    total = 0
    for dirpath, _dirs, names in os.walk(source):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if total > limit:
            return total
    return None


def _clear(path: Path) -> None:
    """Remove what the job left under a name the worker writes (a link, a file, a FIFO), never following it."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            bundles.remove_tree(path)
        else:
            path.unlink()


def make(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> Path:
    """The job's working directory, copied now unless an earlier attempt or node already made it."""
    target = run_dir / WORKDIR_NAME
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(target)
        if stat.S_ISDIR(st.st_mode):
            return target
        log.warning("%s is not a directory (the job replaced it?); copying the code again", target)
        _clear(target)
    source, place = _source(settings, spec, run_dir)
    if source is not None and (total := _too_large(source, settings.max_code_unpacked_bytes)) is not None:
        raise SetupFailed(f"the code to copy into the working directory ({source}) holds more than {total} bytes; "
                          f"at most {settings.max_code_unpacked_bytes} (TORCHYARD_MAX_CODE_UNPACKED_BYTES)")
    tmp = run_dir / f".workdir-{secrets.token_hex(6)}"
    record = run_dir / f".workdir-{secrets.token_hex(6)}.json"
    tmp.mkdir(mode=0o700)
    try:
        if source is not None:
            dest = tmp / place if place else tmp
            # Links stay links: a bundle's were checked to resolve inside it, so they resolve inside the copy.
            shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
            _writable(tmp)
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        with os.fdopen(fd, "w") as f:
            f.write(manifest_json(_uploaded(tmp)))
        os.chmod(tmp, 0o755)
        # The record first: a worker lost between the two renames leaves no copy without its record.
        os.rename(record, run_dir / MANIFEST_NAME)  # replaces whatever is there, a planted link included
        os.rename(tmp, target)
    except BaseException:
        bundles.remove_tree(tmp)
        record.unlink(missing_ok=True)
        if not target.is_dir():
            raise
        log.info("%s was made meanwhile by another node of the job", target)
    log.info("working directory %s made from %s", target, source or "nothing (an installed module)")
    return target


def code_root(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> Path:
    """Where the entrypoint resolves and the ranks import from: the working directory once made, else (a node
    that does not share the run directory's storage) the read-only code, as before."""
    target = run_dir / WORKDIR_NAME
    if target.is_dir() and not target.is_symlink():
        return target
    return bundles.code_root(settings, spec, run_dir)


def entrypoint_in(settings: Settings, spec: ScriptJobSpec) -> str:
    """The entrypoint as a path relative to the code root: an absolute one under TORCHYARD_CODE_DIR names the
    same file in the copy."""
    if spec.code is None and spec.entrypoint.endswith(".py") and os.path.isabs(spec.entrypoint):
        for root in (settings.code_dir, settings.code_dir.resolve()):
            with contextlib.suppress(ValueError):
                return str(Path(spec.entrypoint).relative_to(root))
    return spec.entrypoint


def working_dir(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> Path:
    """Where the ranks start: the copy of the uploaded directory; for a code-root file ``repo/train.py`` the copy
    of ``repo/``, its repository; for a module, the directory holding its package, as ``python -m`` wants."""
    root = code_root(settings, spec, run_dir)
    if root != run_dir / WORKDIR_NAME:
        return run_dir
    entry = entrypoint_in(settings, spec)
    if spec.code is None and entry.endswith(".py") and len(Path(entry).parts) > 1:
        top = root / Path(entry).parts[0]
        if top.is_dir() and not top.is_symlink():
            return top
    return root
