"""``torch.load(..., map_location=torch.device("cpu", 0))`` in a rank: torch saves CPU storages tagged ``cpu``
and restores only that tag, so an indexed CPU device fails with "don't know how to restore data location of
torch.storage.UntypedStorage (tagged with cpu:0)".

Accelerate (1.15) gives each rank of a multi-process CPU run the device ``cpu:0`` (``MULTI_CPU``, which
``ACCELERATE_USE_CPU=1`` asks for), and the Hugging Face Trainer 4.x loads the optimizer of a checkpoint it
resumes from onto that device, so every resume of a 4.x Trainer on CPUs failed; 5.x maps to plain ``cpu``.
Registering a restorer for ``cpu:N`` (torch's own ``register_package`` extension point) makes those loads
what they mean: the storage stays on the CPU, where torch has already read it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from trainer.import_hooks import after_import

# torch's own restorers use 10-23; the registry is a sorted list of tuples, so the priority must be unique.
PRIORITY = 97


def restore(storage: Any, location: str) -> Any:
    """The storage as it is for ``cpu:N``; None (not this restorer's) for any other location."""
    kind, _, index = location.partition(":")
    return storage if kind == "cpu" and index.isdigit() else None


def _tag(_obj: Any) -> None:
    return None  # saving keeps torch's own tags


def _register(serialization: ModuleType) -> None:
    if any(entry[2] is restore for entry in serialization._package_registry):
        return
    serialization.register_package(PRIORITY, _tag, restore)


def install() -> None:
    """From the moment torch loads in this process, ``torch.load`` restores ``cpu:N`` locations onto the CPU."""
    after_import("torch.serialization", _register)
