"""Placement: which queued jobs start now, on which hosts and GPUs, and why the others wait.

``schedule(queued, hosts, running) -> Decision`` is a pure function (no I/O, no clock): the leader
runs it and writes its answer; tests and trace replays (``jobs.scheduling.simulate``) call it as is.
"""

from jobs.scheduling.model import WHOLE_HOST, Decision, Host, NodePlacement, Placement, QueuedJob, Waiting
from jobs.scheduling.policy import order_key, schedule

__all__ = ["WHOLE_HOST", "Decision", "Host", "NodePlacement", "Placement", "QueuedJob", "Waiting", "order_key", "schedule"]
