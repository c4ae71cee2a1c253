"""A stopping host (docker stop: SIGTERM to the worker) leaves the scheduler's view before its supervisors hand
their jobs back, and stops every task, one forked a moment before the stop included."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from jobs.scheduling.scheduler import host_queue
from tests.helpers import wait_until
from worker import host_runner
from worker.host_runner import HostRunner


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_stop_reaches_a_task_that_had_no_handler_yet_and_only_after_the_host_left(
        tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, restore_signals: None) -> None:
    term_file, left_file = tmp_path / "task-stopped", tmp_path / "host-left"

    def slow_to_listen(job_id: str, attempt: int, node_rank: int) -> str:
        # A supervisor still importing and connecting: the host's first SIGTERM lands before it listens.
        time.sleep(1.5)
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        if not stopped.wait(30):
            return "never stopped"
        term_file.write_text(repr(time.time()))
        return "handed back"

    monkeypatch.setattr(host_runner, "run_node", slow_to_listen)
    redis = Redis.from_url(redis_url)
    host = f"host-{os.getpid()}-{time.monotonic_ns()}"
    Queue(host_queue(host), connection=redis).enqueue("worker.supervisor.run_node", "job-1", 1, 0)
    runner = HostRunner(host, redis, on_stopping=lambda: left_file.write_text(repr(time.time())))

    def stop_once_the_task_runs() -> None:
        # The host's SIGTERM once it has started the task (which then sleeps 1.5 s before it listens); a stop before
        # the task starts would only test a host that never took it.
        wait_until(lambda: runner.children, 600, interval_s=0.01, what="the host to start the task")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_the_task_runs, daemon=True).start()

    runner.run()  # returns once every task has ended

    assert not runner.children
    assert term_file.exists(), "the task never saw a stop it could act on"
    assert float(left_file.read_text()) <= float(term_file.read_text())
