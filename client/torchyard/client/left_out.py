"""Files a script names by path that ``.gitignore`` or ``.torchyardignore`` keep out of its bundle.

A simple, honest heuristic, run before ``submit --workdir`` uploads: every string literal in the ``.py`` files of
the entrypoint's directory tree that names an existing path (from the directory's root, where the job starts, or
from the file's own directory) which the bundle leaves out, whole or in part. Prepared data is the usual case:
``data/`` in ``.gitignore`` and ``open("data/train.bin")`` in the script. Paths built at run time (f-strings,
``os.path.join`` of variables) are not seen; nothing is ever left out by this check, it only warns.
"""

from __future__ import annotations

import ast
import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from torchyard.client.pack import walk

log = logging.getLogger(__name__)

MAX_LITERAL = 255
MAX_SOURCE_BYTES = 2 * 1024 * 1024  # a generated giant module is not read for paths


@dataclass(frozen=True)
class LeftOut:
    path: str  # relative to the uploaded directory, posix
    files: int  # files on disk under it that the bundle leaves out (1 for a file)
    named_in: str  # the .py file whose literal names it

    def message(self) -> str:
        what = "is" if self.files == 1 and not self.path.endswith("/") else f"holds {self.files} files that are"
        return (f"{self.path} {what} left out of the upload by .gitignore/.torchyardignore, but {self.named_in} names it: "
                "list it with '!' in .torchyardignore if the job needs it")


def literals(source: str) -> list[str]:
    """The string constants of a Python source that could be paths: short, one line, no NUL; none when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text and len(text) <= MAX_LITERAL and "\n" not in text and "\x00" not in text and "://" not in text:
                found.append(text)
    return found


def candidates(literal: str, file_dir: str) -> list[str]:
    """The normalised relative paths a literal may name: from the root (the job's working directory) and from the
    naming file's directory; none when it is absolute or climbs out of the root."""
    if os.path.isabs(literal) or literal.startswith("~"):
        return []
    out = []
    for base in dict.fromkeys(("", file_dir)):
        joined = os.path.normpath(os.path.join(base, literal)) if base else os.path.normpath(literal)
        if joined in (".", "") or joined.startswith(".."):
            continue
        out.append(PurePosixPath(joined).as_posix())
    return out


def left_out(named: dict[str, list[str]], on_disk: dict[str, int], packed: set[str]) -> list[LeftOut]:
    """The policy, without the filesystem: ``named`` maps each scanned .py file to its literals, ``on_disk`` every
    existing path to its file count (0 for a directory is fine: counted below), ``packed`` what the bundle holds.
    A named file the bundle lacks, or a named directory some of whose files it lacks, is left out; each once."""
    files_on_disk = {p for p, n in on_disk.items() if n == 1}
    found: dict[str, LeftOut] = {}
    for py, texts in sorted(named.items()):
        file_dir = str(PurePosixPath(py).parent) if "/" in py else ""
        for text in texts:
            for path in candidates(text, file_dir):
                if path in found or path not in on_disk:
                    continue
                if path in files_on_disk:
                    missing = 0 if path in packed else 1
                    shown = path
                else:
                    missing = sum(1 for f in files_on_disk if f.startswith(path + "/") and f not in packed)
                    shown = path + "/"
                if missing:
                    found[path] = LeftOut(shown, missing, py)
    return list(found.values())


MAX_WALKED = 100_000  # files counted under one named directory


def _disk(root: Path, paths: set[str]) -> dict[str, int]:
    """The named paths that exist inside the root, and every file under the named directories: 1 a file, 0 a directory."""
    out: dict[str, int] = {}
    for rel in sorted(paths):
        path = root / rel
        if rel in out or path.is_symlink() or not path.resolve().is_relative_to(root):
            continue
        if path.is_file():
            out[rel] = 1
        elif path.is_dir():
            out[rel] = 0
            for dirpath, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(dirpath, d))]
                for name in files[:MAX_WALKED - len(out)]:
                    if os.path.isfile(os.path.join(dirpath, name)):
                        out[Path(dirpath, name).relative_to(root).as_posix()] = 1
                if len(out) >= MAX_WALKED:
                    break
    return out


def check(directory: str | Path, entrypoint: str) -> list[LeftOut]:
    """What the bundle of ``directory`` leaves out that the entrypoint's directory tree names by path."""
    root = Path(directory).resolve()
    packed = {rel for rel, _ in walk(root)}
    entry = entrypoint.replace("\\", "/")
    start = (root / entry).parent if entry.endswith(".py") else root / entry.split(".")[0]
    if not start.is_dir() or not start.resolve().is_relative_to(root):
        start = root
    named: dict[str, list[str]] = {}
    for rel in sorted(packed):
        path = root / rel
        if rel.endswith(".py") and path.is_file() and path.resolve().is_relative_to(start.resolve()) \
                and path.stat().st_size <= MAX_SOURCE_BYTES:
            named[rel] = literals(path.read_text(errors="replace"))
    wanted = {c for py, texts in named.items() for t in texts
              for c in candidates(t, str(PurePosixPath(py).parent) if "/" in py else "")}
    return left_out(named, _disk(root, wanted), packed)
