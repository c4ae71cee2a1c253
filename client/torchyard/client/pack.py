"""Pack a working directory into a code bundle: the canonical tar archive ``POST /v1/code`` takes.

What is left out: ``.git`` directories, and whatever ``.gitignore`` and ``.torchyardignore`` files
exclude, with git's rules (pathspec's GitIgnoreSpec): patterns relative to the directory of the file
that holds them, a deeper file overriding a shallower one, ``.torchyardignore`` after ``.gitignore``
in the same directory (so it can re-include with ``!``), and nothing inside an excluded directory.

The archive is canonical, so the same files give the same bytes and the same sha256 on any machine:
POSIX pax format, members sorted by path, directories before their contents, every mtime 0, uid/gid
0 with empty user and group names, modes 0755 (directories, executables) or 0644, symlinks kept as
relative links when they stay inside the directory (one that leaves it is an error: it could not be
unpacked on the workers). Sockets, FIFOs and devices are skipped.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pathspec

from torchyard.client.errors import TorchyardError

log = logging.getLogger(__name__)

IGNORE_FILES = (".gitignore", ".torchyardignore")
ALWAYS_SKIPPED = frozenset({".git"})
_CHUNK = 1 << 20


class PackError(TorchyardError):
    """The directory cannot be packed (missing, or a symlink that leaves it)."""


@dataclass
class Packed:
    """A packed directory: the archive in a temporary file (closed with ``close()`` or ``with``)."""

    digest: str  # "sha256:<hex>"
    size_bytes: int
    files: int
    file: IO[bytes] = field(repr=False)
    paths: list[str] = field(default_factory=list, repr=False)

    def chunks(self, gzip: bool = False) -> Iterator[bytes]:
        """The archive from the start, gzip-compressed on the fly when asked."""
        self.file.seek(0)
        deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip else None
        while block := self.file.read(_CHUNK):
            out = deflate.compress(block) if deflate else block
            if out:
                yield out
        if deflate:
            yield deflate.flush()

    def compressible(self, samples: int = 16, block: int = 64 * 1024) -> bool:
        """Whether gzip pays for its time: blocks spread over the archive shrink by more than 10%.
        Weights, images and other compressed data do not, and deflating them costs seconds for nothing."""
        if self.size_bytes == 0:
            return False
        raw = packed = 0
        for i in range(samples):
            self.file.seek(self.size_bytes * i // samples)
            data = self.file.read(block)
            raw += len(data)
            packed += len(zlib.compress(data, 1))
        return packed < 0.9 * raw

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Packed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, target: IO[bytes]):
        super().__init__()
        self.target, self.hash, self.size = target, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.hash.update(b)
        self.size += len(b)
        return self.target.write(b)


def _spec_for(directory: Path) -> pathspec.GitIgnoreSpec | None:
    lines: list[str] = []
    for name in IGNORE_FILES:
        path = directory / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


def _ignored(rel_parts: tuple[str, ...], is_dir: bool, specs: list[tuple[tuple[str, ...], pathspec.GitIgnoreSpec]]) -> bool:
    """Git's answer for one path: the deepest ignore file with a matching pattern decides."""
    decision = False
    for base, spec in specs:  # shallow to deep
        if rel_parts[:len(base)] != base:
            continue
        relative = "/".join(rel_parts[len(base):]) + ("/" if is_dir else "")
        result = spec.check_file(relative)
        if result.include is not None:
            decision = result.include
    return decision


def walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every path that goes into the bundle, relative (posix), with its lstat, in archive order."""
    root = root.resolve()
    if not root.is_dir():
        raise PackError(f"{root}: not a directory")
    specs: list[tuple[tuple[str, ...], pathspec.GitIgnoreSpec]] = []
    found: list[tuple[tuple[str, ...], os.stat_result]] = []

    def visit(directory: Path, parts: tuple[str, ...]) -> None:
        spec = _spec_for(directory)
        if spec is not None:
            specs.append((parts, spec))
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            child = (*parts, entry.name)
            st = entry.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if entry.name in ALWAYS_SKIPPED or _ignored(child, is_dir, specs):
                continue
            if not (is_dir or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                log.warning("skipping %s: not a regular file, directory or symlink", "/".join(child))
                continue
            found.append((child, st))
            if is_dir:
                visit(Path(entry.path), child)
        if spec is not None:
            specs.pop()

    visit(root, ())
    found.sort(key=lambda item: item[0])
    return [("/".join(parts), st) for parts, st in found]


def _link_target(root: Path, rel: str) -> str:
    """A symlink's target as a relative link that stays inside ``root``; PackError otherwise."""
    link = root / rel
    raw = os.readlink(link)
    resolved = (link.parent / raw).resolve() if not os.path.isabs(raw) else Path(raw).resolve()
    # Not jobspec.paths.within: the client imports nothing of the service (nor `trainer`, which a user's trainer.py shadows).
    if resolved != root and root not in resolved.parents:
        raise PackError(f"{rel} is a symlink to {raw}, outside {root}: copy the file in, or list it in .torchyardignore")
    return os.path.relpath(resolved, link.parent) if os.path.isabs(raw) else raw


def pack(directory: str | Path) -> Packed:
    """Pack ``directory`` into a canonical tar archive in a temporary file, hashing it on the way."""
    root = Path(directory).resolve()
    entries = walk(root)
    out = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller inside Packed, which closes it
    sink = _Hashing(out)
    files = 0
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for rel, st in entries:
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if stat.S_ISDIR(st.st_mode):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, _link_target(root, rel)
                tar.addfile(info)
            else:
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                with (root / rel).open("rb") as f:
                    info.size = os.fstat(f.fileno()).st_size
                    tar.addfile(info, f)
                files += 1
    out.flush()
    return Packed(f"sha256:{sink.hash.hexdigest()}", sink.size, files, out, [rel for rel, _ in entries])
