"""Checking a code bundle's tar archive from its headers alone, before anything is unpacked.

An archive is refused whole (``BundleRefused``, naming the member) when a member has an absolute path
or ``..``, is a device file, a FIFO or a hard link, lies under a symlink, appears twice, is a symlink
that resolves outside the bundle, or has a name the filesystem cannot hold (a component over 255
bytes, a path that would not fit under PATH_MAX once unpacked). An archive whose files add up to
more than the cap, each counted at its full size (a sparse member as the file it unpacks to, not the
few bytes it stores), is refused with ``BundleTooLarge``.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import PurePosixPath

MAX_MEMBERS = 100_000
NAME_MAX = 255  # bytes in one path component on every filesystem Linux mounts for data (ext4, xfs, btrfs, overlayfs)
# A member's path, leaving room under PATH_MAX (4096) for the directory it is unpacked into.
MAX_NAME_BYTES = 3072
MAX_LINK_BYTES = 4095
_SYMLINK_HOPS = 40


class BundleRefused(ValueError):
    """The archive cannot be a bundle (HTTP 422); ``member`` names the offending entry when there is one."""

    def __init__(self, reason: str, member: str | None = None):
        if member is not None:
            member = _printable(member)
        self.member, self.reason = member, reason
        super().__init__(f"{member}: {reason}" if member is not None else reason)


def _printable(name: str) -> str:
    """A member name as a JSON answer can carry it: bytes that are not UTF-8 (tar's surrogate escapes) as \\xNN."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode()


class BundleTooLarge(ValueError):
    """The archive is larger than ``max_code_bytes``, or unpacks to more than ``max_code_unpacked_bytes`` (HTTP 413)."""


def parts_of(name: str) -> tuple[str, ...]:
    """A member name's path components, without empty and "." ones."""
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


def _fs_len(text: str) -> int:
    """Length in bytes on the filesystem; more than any limit when the text has no byte form there."""
    try:
        return len(os.fsencode(text))
    except UnicodeEncodeError:
        return 1 << 30


def _name_problem(name: str, parts: tuple[str, ...]) -> str | None:
    """Why the filesystem cannot hold this path, or None."""
    if "\x00" in name:
        return "name has a NUL character"
    if _fs_len(name) > MAX_NAME_BYTES:
        return f"path is longer than {MAX_NAME_BYTES} bytes"
    if any(_fs_len(p) > NAME_MAX for p in parts):
        return f"a path component is longer than {NAME_MAX} bytes, more than a filesystem holds"
    return None


def check_members(tar: tarfile.TarFile, max_unpacked_bytes: int | None = None) -> list[tarfile.TarInfo]:
    """Every member, checked; raises BundleRefused naming the first one that cannot be unpacked safely, and
    BundleTooLarge as soon as the files add up to more than ``max_unpacked_bytes``. Reads headers only."""
    members: list[tarfile.TarInfo] = []
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    links: dict[tuple[str, ...], str] = {}
    unpacked = 0
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise BundleRefused(f"more than {MAX_MEMBERS} members")
        name = m.name
        if name.startswith("/") or PurePosixPath(name).is_absolute():
            raise BundleRefused("absolute path", name)
        if ".." in name.split("/"):
            raise BundleRefused("'..' in the path", name)
        parts = parts_of(name)
        problem = _name_problem(name, parts)
        if problem is not None:
            raise BundleRefused(problem, name)
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
            if _fs_len(m.linkname) > MAX_LINK_BYTES:
                raise BundleRefused(f"symlink target is longer than {MAX_LINK_BYTES} bytes", name)
            links[parts] = m.linkname
        if m.isreg():
            # TarInfo.size of a sparse member is the size of the file it unpacks to, not of the data stored.
            unpacked += m.size
            if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
                raise BundleTooLarge(f"code bundle unpacks to more than {max_unpacked_bytes} bytes "
                                     f"(TORCHYARD_MAX_CODE_UNPACKED_BYTES), counting every file at its full size")
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

