"""The dashboard's copy of the loss columns' mapping (``static/metric-names.js``), written from its one home,
``torchyard.client.metric_names``: ``python -m dashboard.metric_names`` (a test checks the two agree)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torchyard.client.metric_names import DISPLAY

JS_MODULE = Path(__file__).resolve().parent / "static" / "metric-names.js"


def js_module() -> str:
    """The dashboard's copy of DISPLAY, as an ES module."""
    return (
        "// Written by `python -m dashboard.metric_names` from torchyard/client/metric_names.py, the mapping's one home: edit it there.\n"
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
