"""When the watch stops a running attempt (worker.watch_rules.stop_now): the timeout counts from the first time the
ranks run, never while they wait in an engine's queue; a stall counts from rank 0's first event and never after it
said "done"; and when several reasons hold at once, the one recorded is the first in the documented order."""

from __future__ import annotations

from jobs.store.models import Status
from jobspec.spec import spec_from_dict
from worker.executors.base import EngineReason, Phase, RankState
from worker.tail import BadEvent
from worker.verdicts import Why
from worker.watch_rules import Clocks, stop_now

SPEC = spec_from_dict({"name": "watched", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
                       "timeout_s": 100, "stall_timeout_s": 30})
RUNNING, PENDING = RankState(Phase.RUNNING), RankState(Phase.PENDING)


def test_the_timeout_runs_from_the_first_time_the_ranks_run() -> None:
    clock = Clocks(last_heartbeat_ok=0.0)
    clock.saw(PENDING, 0.0)  # an hour in Slurm's queue does not count
    assert stop_now(SPEC, PENDING, Status.RUNNING, clock, 3600.0) is None
    clock.saw(RUNNING, 3600.0)
    clock.saw(RUNNING, 3650.0)  # armed once
    assert stop_now(SPEC, RUNNING, Status.RUNNING, clock, 3700.0) is None
    stop = stop_now(SPEC, RUNNING, Status.RUNNING, clock, 3701.0)
    assert stop is not None and stop.why is Why.TIMEOUT and "timeout_s=100" in stop.detail


def test_a_stall_counts_from_the_first_event_and_not_after_done() -> None:
    clock = Clocks(last_heartbeat_ok=0.0, started=0.0)
    assert stop_now(SPEC, RUNNING, Status.RUNNING, clock, 60.0) is None  # start-up: bounded by timeout_s only
    clock.last_progress = 10.0
    stop = stop_now(SPEC, RUNNING, Status.RUNNING, clock, 41.0, last_phase="training")
    assert stop is not None and stop.why is Why.STALLED
    assert stop_now(SPEC, RUNNING, Status.RUNNING, clock, 41.0, last_phase="done") is None  # a slow teardown


def test_the_first_reason_in_order_wins() -> None:
    clock = Clocks(last_heartbeat_ok=0.0, started=0.0, last_progress=0.0)  # timed out and stalled by now=1000
    unschedulable = RankState(Phase.PENDING, reason=EngineReason.UNSCHEDULABLE)
    every = {"bad_event": BadEvent(3, "not json"), "host_stopping": True, "stop_request": "make room for job x"}
    order = [("bad_event", Why.BAD_EVENT), ("cancel", Why.CANCEL), ("host_stopping", Why.HOST_STOPPING),
             ("stop_request", Why.MAKE_ROOM), ("unschedulable", Why.UNSCHEDULABLE), ("timeout", Why.TIMEOUT)]
    for i, (_, why) in enumerate(order):
        left = {name for name, _ in order[i:]}
        status = Status.CANCELLING if "cancel" in left else Status.RUNNING
        state = unschedulable if "unschedulable" in left else RUNNING
        kwargs = {k: v for k, v in every.items() if k in left}
        stop = stop_now(SPEC, state, status, clock, 1000.0, **kwargs)  # type: ignore[arg-type]
        assert stop is not None and stop.why is why, (left, stop)
    # The scheduler's request is for a running job only: one already cancelling is cancelled, not moved.
    stop = stop_now(SPEC, RUNNING, Status.CANCELLING, Clocks(0.0), 1.0, stop_request="make room")
    assert stop is not None and stop.why is Why.CANCEL
