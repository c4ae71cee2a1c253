"""Import torchyard's own ``trainer`` and ``client`` packages even where a user's ``trainer.py`` or
``client.py`` comes first on ``sys.path`` (a script job's code root, a laptop's working directory).

Their modules are loaded from the directory this package sits in, then the top-level name is handed
back to whatever the user's code had or will import: only the full names of the modules loaded here
(``trainer.report``, ``trainer.sinks...``, ``client.client``...) stay in ``sys.modules``, which is where
the SDK's own later imports find them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent  # where trainer/ and client/ of this installation are


def _ours(module: ModuleType | None, package: str) -> bool:
    return _ours_path(getattr(module, "__file__", None) or "", package)


def load(package: str, modules: list[str]) -> list[ModuleType]:
    """``package``'s ``modules`` (full names) as this installation has them."""
    top = sys.modules.get(package)
    found = importlib.util.find_spec(package) if top is None else None
    if (top is not None and _ours(top, package)) or (found is not None and _ours_path(found.origin or "", package)):
        return [importlib.import_module(m) for m in modules]
    theirs = {n: sys.modules.pop(n) for n in list(sys.modules) if n == package or n.startswith(package + ".")}
    saved = sys.path[:]
    sys.path.insert(0, str(ROOT))
    importlib.invalidate_caches()
    try:
        return [importlib.import_module(m) for m in modules]
    finally:
        sys.path[:] = saved
        sys.modules.pop(package, None)
        sys.modules.update(theirs)
        importlib.invalidate_caches()


def _ours_path(origin: str, package: str) -> bool:
    return os.path.realpath(origin).startswith(str(ROOT / package) + os.sep)
