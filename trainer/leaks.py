"""Packages of the worker's own environment that change what a user's framework does, hidden from a
script's ranks unless the job's ``requirements`` name them.

``rich`` is installed for torchyard's command line. Lightning (2.6 and later) picks its Rich progress
bar whenever the ``rich`` distribution is installed (``RequirementCache("rich>=10.2.2")``, a lookup of
the package's metadata), and Rich draws nothing to a pipe until the run ends, so ``torchyard logs``
would show no progress while the job runs. Hidden, the same script picks its tqdm bar, whose redraws
become lines of the log (trainer/rank_output.py). Hiding means: to imports, ``importlib.util.find_spec``
and package metadata alike, the package is not installed.
"""

from __future__ import annotations

import importlib
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


class _Filtered:
    """Stands in for a finder on sys.meta_path (PathFinder): the hidden names are neither importable
    (``find_spec`` is None, as for a package that is not installed, so ``importlib.util.find_spec`` checks
    say so too) nor have metadata; everything else is the finder's own answer."""

    def __init__(self, inner: Any, names: set[str]):
        self.inner, self.names = inner, names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if _canonical(name.partition(".")[0]) in self.names:
            return None
        return self.inner.find_spec(name, path, target)

    def find_distributions(self, context: Any = None) -> Iterator[metadata.Distribution]:
        context = context if context is not None else metadata.DistributionFinder.Context()
        name = getattr(context, "name", None)
        if name is not None:
            return iter(()) if _canonical(name) in self.names else iter(self.inner.find_distributions(context))
        return (d for d in self.inner.find_distributions(context) if _canonical(d.metadata["Name"] or "") not in self.names)

    def invalidate_caches(self) -> None:
        self.inner.invalidate_caches()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def hide(names: tuple[str, ...] = HIDDEN, run_dir: str | None = None) -> set[str]:
    """Hide ``names`` in this process unless the job asked for them; returns what was hidden."""
    hidden = {_canonical(n) for n in names} - asked_for(run_dir if run_dir is not None else os.environ.get("TORCHYARD_RUN_DIR"))
    hidden = {n for n in hidden if n not in sys.modules}  # already in use here: left alone
    if not hidden:
        return hidden
    for i, finder in enumerate(sys.meta_path):
        if hasattr(finder, "find_distributions") and hasattr(finder, "find_spec"):
            sys.meta_path[i] = _Filtered(finder, hidden)  # type: ignore[call-overload]
    importlib.invalidate_caches()
    return hidden
