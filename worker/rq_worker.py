"""The RQ worker class torchyard runs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal

from rq import Worker

log = logging.getLogger(__name__)


class TorchyardWorker(Worker):
    """RQ does not pass SIGTERM to the work horse: on a warm shutdown (docker stop, Ctrl+C) we
    forward it, so the supervisor stops torchrun gracefully, the trainer checkpoints, and the job
    goes back to the queue instead of dying with the container."""

    def handle_warm_shutdown_request(self) -> None:
        if self.horse_pid:
            log.warning("worker %s stopping: preempting the job in horse %d", self.name, self.horse_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.horse_pid, signal.SIGTERM)
