"""When node 0's watch (worker/supervisor.py) stops a running attempt, as one pure function of what it saw this round
and its clocks. The verdict on why the attempt stopped is worker/verdicts.py's, once the ranks are down.

The order of the checks is their precedence: a malformed event, a cancel, a stopping host, the scheduler's request
to make room, an engine that can never run the attempt as asked, the attempt's timeout, a stall of rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.store.models import Status
from jobspec.spec import AnySpec
from worker.executors.base import Phase, RankState
from worker.tail import BadEvent
from worker.verdicts import Stop, Why


@dataclass
class Clocks:
    """Clocks of one attempt's watch (monotonic seconds)."""

    last_heartbeat_ok: float
    # Armed when the executor first reports the ranks running: an attempt waiting in an engine's queue
    # (a pending Slurm job) has not started its timeout_s.
    started: float | None = None
    # Armed by the first event: start-up (imports, rendezvous, data) is bounded by timeout_s instead.
    last_progress: float | None = None
    next_heartbeat: float = 0.0

    def saw(self, state: RankState, now: float) -> None:
        """The executor's word on the ranks at ``now``: the timeout runs from the first time they run."""
        if self.started is None and state.phase is Phase.RUNNING:
            self.started = now


def stop_now(spec: AnySpec, state: RankState, status: Status, clock: Clocks, now: float, *, bad_event: BadEvent | None = None,
             last_phase: str | None = None, host_stopping: bool = False, stop_request: str | None = None) -> Stop | None:
    """Why the running attempt must stop now, if it must. ``status`` is the job's in SQL, ``last_phase`` rank 0's last
    announced phase, ``host_stopping`` whether the worker was told to stop, ``stop_request`` the scheduler's."""
    if bad_event is not None:
        return Stop(Why.BAD_EVENT, detail=f"malformed event: {bad_event}")
    if status == Status.CANCELLING:
        return Stop(Why.CANCEL)
    if host_stopping:
        return Stop(Why.HOST_STOPPING)
    if stop_request and status == Status.RUNNING:
        return Stop(Why.MAKE_ROOM, detail=stop_request)
    if state.reason is not None:  # still pending, and the engine says it can never run as asked
        return Stop(Why.UNSCHEDULABLE, state=state)
    if clock.started is not None and now - clock.started > spec.timeout_s:
        return Stop(Why.TIMEOUT, detail=f"timeout: attempt ran longer than timeout_s={spec.timeout_s}")
    # After "done" (last step and final checkpoint stored) nothing more is said: a slow teardown is not a stall.
    if (spec.stall_timeout_s and clock.last_progress is not None and last_phase != "done"
            and now - clock.last_progress > spec.stall_timeout_s):
        return Stop(Why.STALLED, detail=f"stalled: no progress from rank 0 for {spec.stall_timeout_s}s")
    return None
