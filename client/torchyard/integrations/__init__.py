"""One-line adapters from the frameworks' own hooks to torchyard's SDK (``torchyard.report``).

    Trainer(callbacks=[LightningCallback()])                # Lightning
    Trainer(..., callbacks=[HuggingFaceCallback()])         # Hugging Face transformers
    Accelerator(log_with=[AccelerateTracker()])             # Accelerate

Without them a job's TensorBoard files and checkpoints are found anyway; with them the metrics arrive
through events.jsonl at once (no event file needed) and checkpoints are reported as they are saved.
Each framework is imported only when its adapter is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "LightningCallback": "torchyard.integrations.lightning",
    "HuggingFaceCallback": "torchyard.integrations.huggingface",
    "AccelerateTracker": "torchyard.integrations.accelerate",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def numbers(values: dict[str, Any] | None) -> dict[str, float]:
    """The values that are plain numbers or one-element tensors, as floats (a framework's logs mix in strings)."""
    out: dict[str, float] = {}
    for name, value in (values or {}).items():
        if hasattr(value, "numel") and callable(value.numel):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out
