"""Path safety in one place: what a job, a user or an archive names is resolved, symlinks followed, and used only
when it stays under the root it must stay under (the code root, the data root, a run directory, a bundle).

Stdlib only and torch-free: the API, the worker, the CLI and the rank bootstrap all import it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


def within(path: str | Path, root: str | Path) -> bool:
    """``path``, symlinks resolved, is ``root`` (resolved too) or under it."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real == top or top in real.parents


def resolve_under(root: Path, relative: str) -> Path | None:
    """``root/relative`` resolved (symlinks too) if it stays under root, else None."""
    if not relative or "\x00" in relative or os.path.isabs(relative):
        return None
    target = (root.resolve() / relative).resolve()
    return target if within(target, root) else None


def data_file(data_dir: Path, relative: str) -> Path:
    """The file ``relative`` names under the data root; ValueError or FileNotFoundError saying why not, worded to
    follow the quoted name ("'x.pt' is outside the data root")."""
    return _file_under(data_dir, relative, ValueError("is outside the data root"),
                       FileNotFoundError("does not exist under the data root"))


def _file_under(root: Path, relative: str, outside: Exception, missing: Exception) -> Path:
    """The regular file ``relative`` names under ``root``; raises ``outside`` or ``missing`` otherwise."""
    path = resolve_under(root, relative)
    if path is None:
        raise outside
    if not path.is_file():
        raise missing
    return path


@dataclass(frozen=True)
class Entrypoint:
    """A checked entrypoint: a .py file under the code root, or a module (``python -m``)."""

    file: Path | None = None  # resolved, symlinks followed; run as ``FILE args``
    module: str | None = None  # run as ``-m MODULE args``; ``file`` is set too when it lies under the code root


def resolve_entrypoint(entrypoint: str, code_root: Path | None, allowed_modules: frozenset[str] = frozenset()) -> Entrypoint:
    """Where an entrypoint points; raises ValueError saying why it cannot run.

    An allow-list: a ``.py`` file or a dotted module that resolves inside ``code_root`` (the service's
    code root, or a job's own unpacked code: the caller says which), or an installed module named
    exactly in ``allowed_modules`` (TORCHYARD_SCRIPT_MODULES). Nothing is imported to decide.
    Called at submission (API) and again at launch (worker), because the code may change in between."""
    if "\x00" in entrypoint:
        raise ValueError("contains a NUL character")
    if entrypoint.endswith(".py"):
        return Entrypoint(file=_resolve_script_file(entrypoint, code_root))
    if not re.match(MODULE_PATTERN, entrypoint):
        raise ValueError("must be a .py file under the code root or a dotted module name such as 'mypkg.train'")
    in_root = _module_under_root(entrypoint, code_root) if code_root is not None else None
    if in_root is not None:
        return Entrypoint(module=entrypoint, file=in_root)
    if entrypoint in allowed_modules:
        return Entrypoint(module=entrypoint)
    raise ValueError("no such module under the code root, and not an installed module this service allows "
                     "(TORCHYARD_SCRIPT_MODULES); put your code in the code root")


def _resolve_script_file(entrypoint: str, code_dir: Path | None) -> Path:
    if code_dir is None:
        raise ValueError("script files need a code root (TORCHYARD_CODE_DIR) on this service")
    if ".." in PurePath(entrypoint).parts:
        raise ValueError("'..' is not allowed; give a path under the code root")
    relative = entrypoint
    if os.path.isabs(entrypoint):
        # An absolute path is fine when it names a file in the code root (as given or after resolving the root).
        for root in (code_dir, code_dir.resolve()):
            candidate = PurePath(entrypoint)
            if candidate.is_relative_to(root) and candidate != PurePath(root):
                relative = str(candidate.relative_to(root))
                break
        else:
            raise ValueError("is outside the code root")
    return _file_under(code_dir, relative, ValueError("resolves outside the code root (a symlink pointing out of it?)"),
                       ValueError("no such file under the code root"))


def _module_under_root(module: str, code_dir: Path) -> Path | None:
    """The file ``python -m module`` runs from the code root, or None when the code root lacks it.

    Every package ``__init__.py`` on the way runs too, so each must resolve under the root as well."""
    parts = module.split(".")
    root = code_dir.resolve()
    for depth in range(1, len(parts)):
        init = os.path.join(*parts[:depth], "__init__.py")
        if os.path.lexists(root / init) and resolve_under(root, init) is None:
            raise ValueError(f"{init} resolves outside the code root")
    base = os.path.join(*parts)
    for candidate in (base + ".py", os.path.join(base, "__main__.py")):
        if not os.path.lexists(root / candidate):
            continue
        resolved = resolve_under(root, candidate)
        if resolved is None:
            raise ValueError(f"{candidate} resolves outside the code root (a symlink pointing out of it?)")
        if os.path.isdir(root / base) and candidate.endswith("__main__.py"):
            init = os.path.join(base, "__init__.py")
            if os.path.lexists(root / init) and resolve_under(root, init) is None:
                raise ValueError(f"{init} resolves outside the code root")
        if resolved.is_file():
            return resolved
    if os.path.lexists(root / parts[0]) or os.path.lexists(root / f"{parts[0]}.py"):
        # The top-level name is the code root's: an installed namesake must not be picked up instead.
        raise ValueError(f"no module {module!r} under the code root")
    return None
