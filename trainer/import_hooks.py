"""Run a callback on a module once it has loaded, without importing it first: the ranks' bootstrap stays torch-free
until the script itself imports torch (trainer/rank_bootstrap.py)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it lets the real finder find ``name`` and wraps its loader."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader = spec.loader
                real_exec = loader.exec_module

                def exec_module(module: ModuleType, real_exec: Any = real_exec) -> None:
                    real_exec(module)
                    self.callback(module)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` now when ``name`` is already loaded, else right after it loads."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
