"""Where rank 0's metrics go besides events.jsonl: TensorBoard, MLflow.

Every sink runs on one background thread (``SinkRunner``) fed by a bounded queue, so the training
step only pays for a ``put_nowait``; a slow or unreachable tracking server can delay or, when the
queue is full, drop points for that sink, never the step. ``build`` picks the sinks a job gets;
``EventWriter`` forwards every metric event to them and closes (drains, flushes) them at the end.
"""

from __future__ import annotations

from torchyard.sinks.base import Sink, SinkRunner
from torchyard.sinks.factory import build

__all__ = ["Sink", "SinkRunner", "build"]
