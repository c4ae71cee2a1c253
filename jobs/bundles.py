"""Code bundles: a user's working directory uploaded as a tar archive, stored once per owner and digest.

Storage is the runs volume (``TORCHYARD_BUNDLES_DIR``, default ``RUNS_DIR/.bundles``): every worker
already mounts it read-write, it holds files of any size without loading them into memory, and it
outlives every job, so a retry months later still finds its code. The database would make every
worker stream up to ``MAX_CODE_BYTES`` out of SQL per job and bloat backups with copies of code.

Layout, per owner (the directory name is a digest of the owner, so owners never share or probe
each other's bundles)::

    <bundles>/<owner digest>/<hex>.tar   the archive as uploaded (its sha256 is <hex>), read-only
    <bundles>/<owner digest>/<hex>/      the same files unpacked, read-only: where the API resolves
                                         a job's entrypoint at submission
    <bundles>/.incoming/                 uploads and unpacking in progress; renamed into place whole

An archive is refused whole (``BundleRefused``, naming the member) before anything is kept when a
member has an absolute path or ``..``, is a device file, a FIFO or a hard link, lies under a symlink,
appears twice, or is a symlink that resolves outside the bundle. The worker checks the archive
again (digest and members) when it unpacks it into a job's run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tarfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from jobs.settings import Settings
from trainer.spec import JobSpec, ScriptJobSpec, SpecError, SpecLimits, SpecProblem, resolve_under

log = logging.getLogger(__name__)

PREFIX = "sha256:"
MAX_MEMBERS = 100_000
MAX_NAME_CHARS = 4096
_SYMLINK_HOPS = 40
_CHUNK = 1 << 20
CODE_DIR_NAME = "code"  # a job's unpacked bundle: runs/<id>/code


class BundleRefused(ValueError):
    """The archive cannot be a bundle (HTTP 422); ``member`` names the offending entry when there is one."""

    def __init__(self, reason: str, member: str | None = None):
        self.member, self.reason = member, reason
        super().__init__(f"{member}: {reason}" if member is not None else reason)


class BundleTooLarge(ValueError):
    """The archive is larger than ``max_code_bytes`` (HTTP 413)."""


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


# ------------------------------------------------------------------ checking an archive


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in name.split("/") if p not in ("", "."))


def _resolves_inside(parts: tuple[str, ...], links: dict[tuple[str, ...], str]) -> bool:
    """Resolve a path inside the bundle the way the kernel would, following the archive's own symlinks;
    False when any step leaves the bundle root (or the links loop)."""
    out: list[str] = []
    pending = list(parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return False
            out.pop()
            continue
        out.append(part)
        target = links.get(tuple(out))
        if target is not None:
            hops += 1
            if hops > _SYMLINK_HOPS or target.startswith("/"):
                return False
            out.pop()  # the target is relative to the link's directory
            pending = target.split("/") + pending
    return True


def check_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member, checked; raises BundleRefused naming the first one that cannot be unpacked safely."""
    members: list[tarfile.TarInfo] = []
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    links: dict[tuple[str, ...], str] = {}
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise BundleRefused(f"more than {MAX_MEMBERS} members")
        name = m.name
        if name.startswith("/") or PurePosixPath(name).is_absolute():
            raise BundleRefused("absolute path", name)
        if "\x00" in name or len(name) > MAX_NAME_CHARS:
            raise BundleRefused("name has a NUL character or is too long", name)
        if ".." in name.split("/"):
            raise BundleRefused("'..' in the path", name)
        parts = _parts(name)
        if not parts:
            if m.isdir():
                continue  # "./", the root itself, as `tar -C dir .` writes it
            raise BundleRefused("a file without a name", name)
        if m.islnk():
            raise BundleRefused("hard link", name)
        if m.ischr() or m.isblk():
            raise BundleRefused("device file", name)
        if m.isfifo():
            raise BundleRefused("FIFO", name)
        if not (m.isreg() or m.isdir() or m.issym()):
            raise BundleRefused(f"unsupported member type {m.type!r}", name)
        if parts in seen:
            raise BundleRefused("appears twice in the archive", name)
        if m.issym():
            if not m.linkname or "\x00" in m.linkname or m.linkname.startswith("/"):
                raise BundleRefused(f"symlink to an absolute or empty path {m.linkname!r}", name)
            links[parts] = m.linkname
        seen[parts] = m
        members.append(m)
    for parts, m in seen.items():
        for depth in range(1, len(parts)):
            parent = seen.get(parts[:depth])
            if parent is not None and not parent.isdir():
                what = "a symlink" if parent.issym() else "a file"
                raise BundleRefused(f"lies under {what} ({'/'.join(parts[:depth])})", m.name)
        if m.issym() and not _resolves_inside(parts, links):
            raise BundleRefused(f"symlink to {m.linkname!r} resolves outside the bundle", m.name)
    return members


# ------------------------------------------------------------------ unpacking


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path) -> None:
    """Unpack checked members into the new directory ``dest``, then make it read-only. Nothing is written
    through a symlink: links are created last, and no member lies under one (check_members)."""
    dest.mkdir(mode=0o700)
    dirs = [dest]
    for m in members:
        target = dest.joinpath(*_parts(m.name))
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
            os.chmod(target, 0o555 if m.mode & 0o111 else 0o444)
    for m in members:
        if m.issym():
            target = dest.joinpath(*_parts(m.name))
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.symlink(m.linkname, target)
    for m in members:  # the real filesystem agrees with check_members, or nothing is kept
        if m.issym() and resolve_under(dest, "/".join(_parts(m.name))) is None:
            raise BundleRefused("symlink resolves outside the bundle", m.name)
    for root, subdirs, _ in os.walk(dest):
        dirs += [Path(root) / d for d in subdirs if not os.path.islink(Path(root) / d)]
    for d in sorted(set(dirs), key=lambda p: len(p.parts), reverse=True):
        os.chmod(d, 0o555)


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


def _unpack_checked(archive: Path, dest: Path) -> int:
    """Check the archive's members and unpack them into the new directory ``dest``; the number of files."""
    try:
        with tarfile.open(archive, mode="r:") as tar:
            members = check_members(tar)
            _extract(tar, members, dest)
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
    _unpack_checked(archive, tmp)
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
        self.incoming = settings.bundles_root / ".incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        self.path = self.incoming / f"{secrets.token_hex(8)}.tar"
        self._file = self.path.open("xb")
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
            data = self._inflate.decompress(chunk, self.limit - self.size + 1)
            self._take(data)
            while self._inflate.unconsumed_tail:
                self._take(self._inflate.decompress(self._inflate.unconsumed_tail, self.limit - self.size + 1))
        except zlib.error as exc:
            raise BundleRefused(f"body is not valid gzip ({exc})") from exc

    def finish(self, expected: str | None = None) -> BundleInfo:
        """Check and store the archive; returns its info. Refusals leave nothing behind."""
        try:
            if self._inflate is not None:
                if not self._inflate.eof:
                    raise BundleRefused("gzip body ends early")
                self._take(self._inflate.flush())
            self._file.close()
            digest = f"{PREFIX}{self._hash.hexdigest()}"
            if expected is not None and expected != digest:
                raise BundleRefused(f"the body's digest is {digest}, not {expected} as announced")
            if exists(self.settings, self.owner, digest):
                return info(self.settings, self.owner, digest)
            tmp_tree = self.incoming / f"{self.path.stem}.d"
            files = _unpack_checked(self.path, tmp_tree)
            home = owner_dir(self.settings, self.owner)
            home.mkdir(parents=True, exist_ok=True)
            tree, archive = tree_path(self.settings, self.owner, digest), archive_path(self.settings, self.owner, digest)
            try:
                os.rename(tmp_tree, tree)
            except OSError:
                remove_tree(tmp_tree)  # a concurrent upload of the same bundle won; its tree is complete
                if not tree.is_dir():
                    raise
            os.chmod(self.path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
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


def code_root(settings: Settings, spec: ScriptJobSpec, run_dir: Path) -> Path:
    """Where a script job's entrypoint resolves at launch: its unpacked bundle, else the code root."""
    return run_dir / CODE_DIR_NAME if spec.code is not None else settings.code_dir
