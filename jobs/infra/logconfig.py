"""Process-wide logging: JSON lines (default) or text, each carrying job_id and request_id when known.

Code logs job ids with ``extra={"job_id": ...}``; the API sets the request id for the duration of
a request in ``request_id``, so every line a request causes can be found by it.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import datetime, timezone
from typing import Any

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else came from ``extra`` and is emitted as a field.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "ids"}


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        if not hasattr(record, "job_id"):
            record.job_id = None
        # The text format shows only the ids a line has: "[job=None req=None]" on every line is noise.
        ids = [f"{k}={v}" for k, v in (("job", record.job_id), ("req", record.request_id)) if v is not None]
        record.ids = f" [{' '.join(ids)}]" if ids else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value is not None:
                out[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(ids)s: %(message)s"


def configure(level: str = "INFO", fmt: str = "json") -> None:
    """Install one stderr handler on the root logger (replacing any), in ``fmt`` json or text."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Alembic's INFO lines (its context, each plugin set up, each revision run) on every start say nothing an operator
    # needs: jobs.store.db says which schema a start migrated to, and Alembic's warnings still come out.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # uvicorn's own loggers propagate to root so they come out in the same format.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
