"""Which logged metric a screen shows as a job's loss and eval loss: the SDK's and the Hugging Face Trainer's
``train/loss`` and ``eval/loss``, else Lightning's ``train_loss_step`` / ``train_loss`` and ``val_loss``.
A display mapping only: the metrics keep the names the script logged (``torchyard metrics``, the API).

This is its one home: ``torchyard ls``, ``--follow`` and ``status`` read it here, and the dashboard from
``dashboard/static/metric-names.js``, written from it by ``python -m client.metric_names`` (a test checks the
two agree)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

# What a column shows -> the logged names that fill it, the first one present winning.
DISPLAY: dict[str, tuple[str, ...]] = {
    "train/loss": ("train/loss", "train_loss_step", "train_loss"),
    "eval/loss": ("eval/loss", "val_loss"),
}

JS_MODULE = Path(__file__).resolve().parents[1] / "dashboard" / "static" / "metric-names.js"


def shown(values: Mapping[str, float], column: str) -> float | None:
    """The value the ``column`` (``train/loss``, ``eval/loss``, or any metric name) shows among ``values``."""
    for name in DISPLAY.get(column, (column,)):
        if name in values:
            return values[name]
    return None


def js_module() -> str:
    """The dashboard's copy of DISPLAY, as an ES module."""
    return (
        "// Written by `python -m client.metric_names` from client/metric_names.py, the mapping's one home: edit it there.\n"
        "// Which logged metric a column shows as the job's loss and eval loss; the metrics keep their logged names.\n"
        f"export const DISPLAY = {json.dumps({k: list(v) for k, v in DISPLAY.items()}, indent=2)};\n\n"
        "export function shown(values, column) {\n"
        "  if (!values) return undefined;\n"
        "  for (const name of DISPLAY[column] ?? [column]) {\n"
        "    if (values[name] !== undefined && values[name] !== null) return values[name];\n"
        "  }\n"
        "  return undefined;\n"
        "}\n"
    )


if __name__ == "__main__":
    JS_MODULE.write_text(js_module())
    sys.exit(0)
