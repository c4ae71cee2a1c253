"""Code bundles: a user's working directory uploaded as a tar archive, stored once per owner and digest.

Storage is the runs volume (``TORCHYARD_BUNDLES_DIR``, default ``RUNS_DIR/.bundles``): every worker
already mounts it read-write, it holds files of any size without loading them into memory, and it
outlives every job, so a retry months later still finds its code. The database would make every
worker stream up to ``MAX_CODE_BYTES`` out of SQL per job and bloat backups with copies of code.

Layout, per owner (the directory name is a digest of the owner, so owners never share or probe
each other's bundles)::

    <bundles>/<owner digest>/<hex>.tar   the archive as uploaded (its sha256 is <hex>)
    <bundles>/<owner digest>/<hex>/      the same files unpacked: where the API resolves a job's
                                         entrypoint at submission
    <bundles>/.incoming/                 uploads and unpacking in progress; renamed into place whole

The bundles directory is the service's alone: directories 0700, files 0600, whatever the umask, so no job's uid
reads another owner's code through it. The API and the workers must run as the same user (or the
workers as root) to share it. Each job gets its own read-only copy under its run directory.

An archive is refused whole before anything is kept when one of its members cannot be unpacked
safely (jobs.code_bundles.check: ``BundleRefused`` naming the member), or when its files add up to more
than ``max_code_unpacked_bytes``, sparse ones at their full size (``BundleTooLarge``), which is
known from the member list before anything is unpacked. The worker checks the archive again (digest,
members and size) when it unpacks it into a job's run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from jobs.code_bundles.check import BundleRefused, BundleTooLarge, check_members, parts_of
from jobs.settings import Settings
from jobspec.paths import resolve_under
from jobspec.spec import JobSpec, ScriptJobSpec, SpecError, SpecLimits, SpecProblem

log = logging.getLogger(__name__)

PREFIX = "sha256:"
BUNDLES_DIR_MODE, BUNDLES_FILE_MODE = 0o700, 0o600
_CHUNK = 1 << 20
CODE_DIR_NAME = "code"  # a job's unpacked bundle: runs/<id>/code
__all__ = ["BundleRefused", "BundleTooLarge", "check_members"]  # checked in jobs.code_bundles.check, refused from here


class BundleMissing(LookupError):
    """No bundle with that digest for that owner."""


@dataclass(frozen=True)
class BundleInfo:
    digest: str  # "sha256:<hex>"
    size_bytes: int
    files: int
    created_at: datetime
    created: bool = False  # True when this request stored it


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>``; ValueError for anything else."""
    value = digest.removeprefix(PREFIX)
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{digest!r} is not a sha256 digest ('sha256:' and 64 lowercase hex digits)")
    return value


def owner_dir(settings: Settings, owner: str) -> Path:
    return settings.bundles_root / hashlib.sha256(owner.encode()).hexdigest()[:32]


def archive_path(settings: Settings, owner: str, digest: str) -> Path:
    return owner_dir(settings, owner) / f"{hex_of(digest)}.tar"


def tree_path(settings: Settings, owner: str, digest: str) -> Path:
    return owner_dir(settings, owner) / hex_of(digest)


def exists(settings: Settings, owner: str, digest: str) -> bool:
    # The archive is renamed into place last: its presence means the unpacked tree is complete too.
    return archive_path(settings, owner, digest).is_file() and tree_path(settings, owner, digest).is_dir()


def info(settings: Settings, owner: str, digest: str) -> BundleInfo:
    if not exists(settings, owner, digest):
        raise BundleMissing(f"no code bundle {digest} for this owner")
    st = archive_path(settings, owner, digest).stat()
    tree = tree_path(settings, owner, digest)
    files = sum(1 for root, _, names in os.walk(tree) for n in names if not os.path.islink(os.path.join(root, n)))
    return BundleInfo(f"{PREFIX}{hex_of(digest)}", st.st_size, files, datetime.fromtimestamp(st.st_mtime, timezone.utc))


def spec_limits(settings: Settings, owner: str, spec: JobSpec | ScriptJobSpec) -> SpecLimits:
    """The host limits a spec is checked against: a script with ``code`` resolves inside its bundle."""
    limits = settings.spec_limits()
    if not isinstance(spec, ScriptJobSpec) or spec.code is None:
        return limits
    if not exists(settings, owner, spec.code):
        raise SpecError([SpecProblem(("code",), f"no code bundle {spec.code} was uploaded by this owner; upload it with POST /v1/code")])
    # Only the code root changes: the module allow-list, queues and secrets rules stay the service's.
    return dataclasses.replace(limits, code_dir=tree_path(settings, owner, spec.code))


# ------------------------------------------------------------------ unpacking


@contextlib.contextmanager
def _unpacking(m: tarfile.TarInfo) -> Iterator[None]:
    """A name this filesystem cannot hold (too long for it, or bytes it refuses) is the archive's fault: 422 naming it."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL):
            raise BundleRefused(f"the filesystem cannot hold this name ({os.strerror(exc.errno)})", m.name) from exc
        raise


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path, *, read_only: bool) -> None:
    """Unpack checked members into the new directory ``dest``. ``read_only``: a job's copy, 0555/0444, which its
    uid reads and cannot change; else the bundles directory's, 0700/0600, the service's user's alone. Nothing is written
    through a symlink: links are created last, and no member lies under one (check_members)."""
    dest.mkdir(mode=0o700)
    dirs = [dest]
    for m in members:
        target = dest.joinpath(*parts_of(m.name))
        with _unpacking(m):
            if m.isdir():
                target.mkdir(mode=0o700, parents=True, exist_ok=True)
                dirs.append(target)
            elif m.isreg():
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                source = tar.extractfile(m)
                assert source is not None
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out, source:
                    shutil.copyfileobj(source, out, _CHUNK)
                    os.fchmod(fd, (0o555 if m.mode & 0o111 else 0o444) if read_only else BUNDLES_FILE_MODE)
    for m in members:
        if m.issym():
            target = dest.joinpath(*parts_of(m.name))
            with _unpacking(m):
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.symlink(m.linkname, target)
    for m in members:  # the real filesystem agrees with check_members, or nothing is kept
        if m.issym() and resolve_under(dest, "/".join(parts_of(m.name))) is None:
            raise BundleRefused("symlink resolves outside the bundle", m.name)
    for root, subdirs, _ in os.walk(dest):
        dirs += [Path(root) / d for d in subdirs if not os.path.islink(Path(root) / d)]
    for d in sorted(set(dirs), key=lambda p: len(p.parts), reverse=True):
        os.chmod(d, 0o555 if read_only else BUNDLES_DIR_MODE)


def remove_tree(path: Path) -> None:
    """Delete a read-only unpacked bundle (its directories are 0555)."""
    if not path.exists() and not path.is_symlink():
        return
    for root, subdirs, _ in os.walk(path):
        for d in subdirs:
            with contextlib.suppress(OSError):
                if not os.path.islink(os.path.join(root, d)):
                    os.chmod(os.path.join(root, d), 0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _unpack_checked(archive: Path, dest: Path, max_unpacked_bytes: int, *, read_only: bool) -> int:
    """Check the archive's members, then unpack them into the new directory ``dest``; the number of files."""
    try:
        with tarfile.open(archive, mode="r:") as tar:
            members = check_members(tar, max_unpacked_bytes)
            _extract(tar, members, dest, read_only=read_only)
    except tarfile.TarError as exc:
        remove_tree(dest)
        raise BundleRefused(f"not a tar archive ({exc})") from exc
    except BaseException:
        remove_tree(dest)
        raise
    return sum(1 for m in members if m.isreg())


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def unpack_for_job(settings: Settings, owner: str, digest: str, run_dir: Path) -> Path:
    """The job's own read-only copy of its bundle, ``run_dir/code``, unpacked once per job (attempts and
    the nodes of a multi-node job share it). The stored archive is checked again: digest and members."""
    target = run_dir / CODE_DIR_NAME
    if target.is_dir():
        return target
    archive = archive_path(settings, owner, digest)
    if not archive.is_file():
        raise BundleMissing(f"code bundle {digest} is no longer stored")
    if _sha256_file(archive) != hex_of(digest):
        raise BundleRefused(f"stored archive of {digest} does not match its digest (corrupted?)")
    tmp = run_dir / f".code-{secrets.token_hex(6)}"
    try:
        _unpack_checked(archive, tmp, settings.max_code_unpacked_bytes, read_only=True)
    except BundleTooLarge as exc:  # the cap was lowered since the upload: the job cannot run, as for any bad archive
        raise BundleRefused(str(exc)) from exc
    # Read-only before the rename, and no rename needs write access to it: the directory stays in run_dir.
    try:
        os.rename(tmp, target)
    except OSError:
        remove_tree(tmp)  # another node of the job unpacked it first
        if not target.is_dir():
            raise
    log.info("unpacked %s into %s", digest, target)
    return target


# ------------------------------------------------------------------ receiving an upload


class Upload:
    """One ``POST /v1/code`` body, streamed to a temporary file while it is hashed and measured; the
    optional gzip transport encoding is inflated on the way, and the cap applies to the tar itself."""

    def __init__(self, settings: Settings, owner: str, *, gzip: bool = False):
        self.settings, self.owner, self.limit = settings, owner, settings.max_code_bytes
        _private_dir(settings.bundles_root)
        self.incoming = settings.bundles_root / ".incoming"
        _private_dir(self.incoming)
        self.path = self.incoming / f"{secrets.token_hex(8)}.tar"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, BUNDLES_FILE_MODE)
        os.fchmod(fd, BUNDLES_FILE_MODE)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if gzip else None
        self.size = 0

    def _take(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise BundleTooLarge(f"code bundle is larger than {self.limit} bytes (TORCHYARD_MAX_CODE_BYTES)")
        self._hash.update(data)
        self._file.write(data)

    def write(self, chunk: bytes) -> None:
        if self._inflate is None:
            self._take(chunk)
            return
        try:
            # Bounded inflation: a small body that inflates to gigabytes stops at the cap.
            self._take(self._inflate.decompress(chunk, self.limit - self.size + 1))
            while self._inflate.unconsumed_tail and not self._inflate.eof:
                self._take(self._inflate.decompress(self._inflate.unconsumed_tail, self.limit - self.size + 1))
        except zlib.error as exc:
            raise BundleRefused(f"body is not valid gzip ({exc})") from exc
        if self._inflate.eof and (self._inflate.unused_data or self._inflate.unconsumed_tail):
            # One gzip member is the whole body: anything after it would be bytes nobody checked.
            raise BundleRefused("bytes after the end of the gzip stream")

    def finish(self, expected: str | None = None) -> BundleInfo:
        """Check and store the archive; returns its info. Refusals leave nothing behind."""
        try:
            if self._inflate is not None:
                if not self._inflate.eof:
                    raise BundleRefused("gzip body ends early (truncated)")
                self._take(self._inflate.flush())
            self._file.close()
            digest = f"{PREFIX}{self._hash.hexdigest()}"
            if expected is not None and expected != digest:
                raise BundleRefused(f"the body's digest is {digest}, not {expected} as announced")
            if exists(self.settings, self.owner, digest):
                return info(self.settings, self.owner, digest)
            tmp_tree = self.incoming / f"{self.path.stem}.d"
            files = _unpack_checked(self.path, tmp_tree, self.settings.max_code_unpacked_bytes, read_only=False)
            home = owner_dir(self.settings, self.owner)
            _private_dir(home)
            tree, archive = tree_path(self.settings, self.owner, digest), archive_path(self.settings, self.owner, digest)
            try:
                # Moving a directory to another parent rewrites its "..": it must be writable to the service's
                # user until here, so the bundles directory's trees are 0700, never read-only.
                os.rename(tmp_tree, tree)
            except OSError:
                remove_tree(tmp_tree)  # a concurrent upload of the same bundle won; its tree is complete
                if not tree.is_dir():
                    raise
            os.replace(self.path, archive)  # the commit point: exists() is true from here on
            log.info("stored code bundle %s (%d bytes, %d files) for %s", digest, self.size, files, self.owner)
            return BundleInfo(digest, self.size, files, datetime.now(timezone.utc), created=True)
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop whatever this upload wrote that was not committed."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        remove_tree(self.incoming / f"{self.path.stem}.d")


def _private_dir(path: Path) -> None:
    """A bundles directory only the service's user enters, whatever the umask or an earlier version left."""
    path.mkdir(mode=BUNDLES_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != BUNDLES_DIR_MODE:
        os.chmod(path, BUNDLES_DIR_MODE)


def code_root(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> Path:
    """Where a script job's entrypoint resolves at launch: its unpacked bundle, else the code root."""
    return run_dir / CODE_DIR_NAME if spec.code is not None else settings.code_dir
