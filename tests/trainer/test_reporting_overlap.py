"""A log step's report completes during the next step, yet events.jsonl reads as if it were written at once:
a metric event comes before any later event (checkpoint, eval, status) and is written, not lost, at close."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch

from torchyard.events import EVENTS_FILE, EventWriter
from trainer.distributed import RankInfo
from trainer.metrics import MetricsReporter

RANK0 = RankInfo(0, 0, 1, 1, torch.device("cpu"), "gloo")


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / EVENTS_FILE).read_text().splitlines()]


def _step(reporter: MetricsReporter, step: int) -> dict[str, float]:
    return reporter.train_step(step, 0, torch.tensor(1.0 / step), torch.tensor(0.5), 0.1)


def test_metric_events_precede_the_checkpoint_and_status_of_their_step(tmp_path: Path) -> None:
    events = EventWriter(tmp_path, enabled=True)
    reporter = MetricsReporter(events, RANK0, every=2, total_steps=6, global_batch=8)
    for step in range(1, 5):
        _step(reporter, step)
        if step == 4:
            events.checkpoint(4, 0, "checkpoints/step_00000004")
    events.metric(4, 0, {"eval/loss": 0.3})
    for step in (5, 6):
        _step(reporter, step)  # the last step completes at once: nothing follows to overlap it
    events.status("done", step=6)
    events.close()
    got = [(e["type"], e["step"], sorted(k for k in e.get("values", {}) if not k.startswith("sys/"))[:1])
           for e in _events(tmp_path)]
    assert got == [("metric", 2, ["train/grad_norm"]), ("metric", 4, ["train/grad_norm"]), ("checkpoint", 4, []),
                   ("metric", 4, ["eval/loss"]), ("metric", 6, ["train/grad_norm"]), ("status", 6, [])]
    assert [e["seq"] for e in _events(tmp_path)] == list(range(1, 7))
    assert _events(tmp_path)[0]["values"]["train/loss"] == 0.5


def test_a_report_in_flight_is_written_at_close(tmp_path: Path) -> None:
    events = EventWriter(tmp_path, enabled=True)
    reporter = MetricsReporter(events, RANK0, every=3, total_steps=1000, global_batch=8)
    for step in range(1, 4):
        assert _step(reporter, step) == {}  # step 3's report is in flight
    ended = time.time()
    time.sleep(0.05)
    events.close()  # what the trainer does on preemption and at exit
    assert [(e["type"], e["step"]) for e in _events(tmp_path)] == [("metric", 3)]
    assert _events(tmp_path)[0]["time"] <= ended  # stamped when its step ended, not when it was written


def test_the_next_step_returns_a_report_whether_or_not_an_event_completed_it_early(tmp_path: Path) -> None:
    """Rank 0 completes a report early when it writes an event; ranks that write none complete it at the next
    step. Both must return it from that next step, or the ranks take different collectives (a hang)."""
    returned = []
    for writes_events in (True, False):
        run_dir = tmp_path / str(writes_events)
        run_dir.mkdir()
        events = EventWriter(run_dir, enabled=writes_events)
        reporter = MetricsReporter(events, RANK0, every=2, total_steps=100, global_batch=8)
        _step(reporter, 1)
        _step(reporter, 2)  # step 2's report is in flight
        events.metric(2, 0, {"eval/loss": 0.3})  # completes it on the rank that writes events
        returned.append(sorted(_step(reporter, 3)))
    assert returned[0] == returned[1] and "train/loss" in returned[0]


def test_run_by_hand_rank_0_logs_each_report_and_under_the_service_it_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("TORCHYARD_JOB_ID", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    caplog.set_level(logging.INFO, logger="trainer.metrics")
    by_hand = MetricsReporter(EventWriter(tmp_path / "a", enabled=True), RANK0, every=2, total_steps=4, global_batch=8)
    for step in range(1, 5):
        _step(by_hand, step)
    lines = [r.getMessage() for r in caplog.records if r.name == "trainer.metrics"]
    assert [line.split("  ")[:2] for line in lines] == [["step 2/4", "loss 0.5000"], ["step 4/4", "loss 0.2500"]]

    caplog.clear()
    monkeypatch.setenv("TORCHYARD_JOB_ID", "01job")  # the worker's ranks: metrics go to the service, not the log
    served = MetricsReporter(EventWriter(tmp_path / "b", enabled=True), RANK0, every=2, total_steps=4, global_batch=8)
    for step in range(1, 5):
        _step(served, step)
    assert not [r for r in caplog.records if r.name == "trainer.metrics"]
