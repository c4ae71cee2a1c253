"""Packages of the worker's own environment that change what a user's framework does, hidden from a
script's ranks unless the job's ``requirements`` name them.

``rich`` is installed for torchyard's command line. Lightning (2.6 and later) picks its Rich progress
bar whenever the ``rich`` distribution is installed (``RequirementCache("rich>=10.2.2")``, a lookup of
the package's metadata), and Rich draws nothing to a pipe until the run ends, so ``torchyard logs``
would show no progress while the job runs. Hidden, the same script picks its tqdm bar, whose redraws
become lines of the log (trainer/rank_output.py). Hiding means: ``import rich`` fails as for a package
that is not installed, and its metadata says version 0, which no version requirement accepts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

HIDDEN = ("rich",)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def asked_for(run_dir: str | None) -> set[str]:
    """The distribution names the job's ``requirements`` list (canonical), from spec.json in its run directory."""
    if not run_dir:
        return set()
    try:
        spec = json.loads((Path(run_dir) / "spec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    names = set()
    for line in spec.get("requirements") or []:
        if isinstance(line, str) and (m := _NAME.match(line)):
            names.add(_canonical(m.group(1)))
    return names


class _Absent(metadata.Distribution):
    def __init__(self, name: str):
        self._name = name

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return f"Metadata-Version: 2.1\nName: {self._name}\nVersion: 0\n"
        return None

    def locate_file(self, path: Any) -> Path:
        return Path(os.devnull)


class _Hider:
    """First on sys.meta_path: answers metadata lookups of the hidden names before the real finders do."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        return None

    def find_distributions(self, context: Any = metadata.DistributionFinder.Context()) -> Iterator[metadata.Distribution]:
        name = getattr(context, "name", None)
        if name and _canonical(name) in self.names:
            yield _Absent(name)


def hide(names: tuple[str, ...] = HIDDEN, run_dir: str | None = None) -> set[str]:
    """Hide ``names`` in this process unless the job asked for them; returns what was hidden."""
    hidden = {_canonical(n) for n in names} - asked_for(run_dir if run_dir is not None else os.environ.get("TORCHYARD_RUN_DIR"))
    hidden = {n for n in hidden if n not in sys.modules or sys.modules[n] is None}  # already in use here: left alone
    if not hidden:
        return hidden
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import fails with ModuleNotFoundError
    sys.meta_path.insert(0, _Hider(hidden))  # type: ignore[arg-type]
    return hidden
