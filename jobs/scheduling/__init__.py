"""Placement: which queued jobs start now, on which hosts and GPUs, and why the others wait.

The pure policy is this package's ``model``, ``policy`` and their helpers; beside it, what applies it: the pass
that reads SQL (``view``), asks the policy and writes its answer (``scheduler``), run under a named lease
(``leader``, ``lease_loop``), with the rules it reads of SQL on the way: owners' quotas (``quotas``), jobs after
jobs (``dependencies``) and the stops and holds it asks of jobs to make room (``stops``).

``schedule(queued, hosts, running) -> Decision`` is a pure function (no I/O, no clock): the leader
runs it and writes its answer; tests and trace replays (``jobs.scheduling.simulate``) call it as is.
With ``now``, ``quotas`` and the previous decision's ``reservations`` it also preempts, lends quota
and reserves hosts for the first blocked job (see ``policy``).
"""

from jobs.scheduling.model import WHOLE_HOST, Decision, Host, NodePlacement, Placement, Preemption, QueuedJob, Quota, Reservation, Waiting
from jobs.scheduling.policy import DEFAULT_MIN_RUNTIME_S, order_key, schedule

__all__ = ["DEFAULT_MIN_RUNTIME_S", "WHOLE_HOST", "Decision", "Host", "NodePlacement", "Placement", "Preemption", "QueuedJob", "Quota",
           "Reservation", "Waiting", "order_key", "schedule"]
