"""The worker's main loop: pop the node tasks the scheduler placed on this host and run each at once.

RQ stays the transport (the queue ``host:<id>``, jobs.scheduling.scheduler.hand_over), but not RQ's worker: a work horse
runs one job at a time, and a host runs as many as were placed on it. Each task is a forked child, as RQ's
work horse is: it starts in milliseconds with every module loaded (a fresh interpreter took seconds, long
enough for a placement's lease to lapse on a busy host), drops the parent's database connections and
Redis reconnects by itself, and a supervisor that dies takes only its own task down. A worker SIGKILLed
alone leaves its supervisors running their jobs to the end; SIGTERM (docker stop) is forwarded to every one
of them once the host has left the scheduler's view, each checkpoints and requeues its job, and the worker
exits once they have.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.job import Job as RQJob

from jobs.infra import fork_guard
from jobs.scheduling.scheduler import host_queue
from worker.rq_worker import TorchyardWorker
from worker.supervisor import run_node

log = logging.getLogger(__name__)

# How often a stopping host repeats its SIGTERM to the tasks still running.
STOP_RESEND_S = 2.0


class HostRunner:
    def __init__(self, host_id: str, redis: Redis, pop_timeout_s: int = 1, on_stopping: Callable[[], None] | None = None):
        self.host_id, self.redis = host_id, redis
        # Called once the stop is seen, before the supervisors are waited for: the host leaves the scheduler's view
        # first, so the jobs they hand back are placed elsewhere, not here again.
        self.on_stopping = on_stopping
        self.queue = Queue(host_queue(host_id), connection=redis)
        self.pop_timeout_s = pop_timeout_s
        self.children: dict[int, str] = {}
        self.stopping = False
        # Registered as an RQ worker of the host's queue, so `rq info`, the local stack and the benchmarks see it;
        # RQ's own work loop is not run (see the module's docstring).
        self.registration = TorchyardWorker([self.queue], connection=redis, name=host_id)
        self._next_beat = 0.0

    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        # Only noted here: the loop leaves the scheduler's view before it stops the supervisors (see _loop).
        if not self.stopping:
            log.warning("host %s stopping: preempting %d task(s)", self.host_id, len(self.children))
        self.stopping = True

    def _stop_children(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def run(self, burst: bool = False) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        log.info("host %s: taking tasks from %s", self.host_id, self.queue.name)
        self.registration.register_birth()
        try:
            self._loop(burst)
        finally:
            with contextlib.suppress(RedisError):
                self.registration.register_death()

    def _beat(self) -> None:
        if time.monotonic() < self._next_beat:
            return
        with contextlib.suppress(RedisError):
            self.registration.set_state("busy" if self.children else "idle")
            self.registration.heartbeat()
            self._next_beat = time.monotonic() + 10

    def _loop(self, burst: bool) -> None:
        while not self.stopping:
            self._beat()
            self._reap()
            task = self._pop()
            if task is None:
                if burst and not self.children:
                    break
                continue
            self._start(task)
            self._next_beat = 0.0
        # Out of the scheduler's view first: stopped before, the supervisors handed their jobs back while this
        # host still looked free, and the scheduler placed them here again, on a host that no longer pops tasks.
        if self.on_stopping is not None:
            self.on_stopping()
        # Then every supervisor, the one started from the last pop included, hands its job back and exits. Sent
        # again while any runs: a task forked a moment before the first has no handler of its own yet, and ignores it.
        next_stop = 0.0
        while self.children:
            if time.monotonic() >= next_stop:
                self._stop_children()
                next_stop = time.monotonic() + STOP_RESEND_S
            self._reap()
            time.sleep(0.2)

    def _pop(self) -> RQJob | None:
        try:
            result = Queue.lpop([self.queue.key], self.pop_timeout_s, connection=self.redis)
        except DequeueTimeout:
            return None
        except RedisError as exc:
            log.warning("host %s: Redis does not answer (%s); trying again", self.host_id, exc.__class__.__name__)
            time.sleep(1.0)
            return None
        if result is None:
            return None
        _, rq_id = result
        rq_id = rq_id.decode() if isinstance(rq_id, bytes) else rq_id
        try:
            return RQJob.fetch(rq_id, connection=self.redis)
        except (NoSuchJobError, RedisError):
            return None

    def _start(self, task: RQJob) -> None:
        job_id, attempt, node_rank = task.args
        name = f"job {job_id} attempt {attempt} node {node_rank}"
        with fork_guard.GUARD.quiet():  # no SQLite lock of another thread may cross into the child
            pid = os.fork()
        if pid == 0:
            os._exit(_child(str(job_id), int(attempt), int(node_rank)))
        self.children[pid] = name
        log.info("host %s: %s started (pid %d)", self.host_id, name, pid)
        with contextlib.suppress(RedisError):
            task.delete()  # SQL holds the attempt from here; the task's hash would only linger in Redis

    def _reap(self) -> None:
        for pid, name in list(self.children.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                log.info("host %s: %s ended (exit %s)", self.host_id, name, os.waitstatus_to_exitcode(status))
                del self.children[pid]
                self._next_beat = 0.0


def _child(job_id: str, attempt: int, node_rank: int) -> int:
    """The forked task: its own signal handling, then the node's supervisor or follower; an exit code, never a return."""
    try:
        # Swallowed until the supervisor installs its own: a stop in between is sent again (HostRunner._loop), where
        # the default action would end the task before it could hand its job back. A handler, not SIG_IGN, which
        # every process started from here would inherit.
        signal.signal(signal.SIGTERM, _before_supervised)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the worker, which forwards a SIGTERM
        verdict = run_node(job_id, attempt, node_rank)
        log.info("job %s attempt %d node %d: %s", job_id, attempt, node_rank, verdict, extra={"job_id": job_id})
        return 0
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's loop
        log.exception("job %s attempt %d node %d: task failed", job_id, attempt, node_rank, extra={"job_id": job_id})
        return 1


def _before_supervised(signum: int, _frame: FrameType | None) -> None:
    """A task's SIGTERM before its supervisor listens: the host runner sends it again."""
