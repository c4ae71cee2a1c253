"""The metric sinks: a script's torchyard.report.metrics lands in TensorBoard too, and a stuck sink never
blocks the training thread (it drops points, counted, instead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers import ROOT
from torchyard.sinks import SinkRunner
from torchyard.sinks.base import Point

SCRIPT = """
from torchyard import report
for step in range(1, 41):
    report.metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.1})
    if step % 10 == 0:
        report.metrics(step, {"eval/accuracy": step / 40})
"""  # no close(): the SDK flushes its sinks at exit


def test_script_metrics_are_written_to_tensorboard_like_events_jsonl(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = {**os.environ, "TORCHYARD_RUN_DIR": str(tmp_path), "RANK": "0", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=120, cwd=tmp_path)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tmp_path / "artifacts" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for name in ("train/loss", "train/lr", "eval/accuracy"):
        expected = [(e["step"], e["values"][name]) for e in events if name in e["values"]]
        got = [(s.step, s.value) for s in acc.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in expected] and expected, name
        assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(expected, got, strict=True)), name


CRASH = """
import sys
from pathlib import Path
from torchyard.sinks import SinkRunner

class Recorder:
    name = "recorder"
    def open(self): pass
    def write(self, points): Path(sys.argv[1], "points").write_text(str(len(points)))
    def close(self, failed=False): Path(sys.argv[1], "closed").write_text("failed" if failed else "finished")

runner = SinkRunner([Recorder()])
runner.put(1, {"train/loss": 1.0})
if sys.argv[2] == "crash":
    raise RuntimeError("the training loop blew up")
runner.close()
"""


@pytest.mark.parametrize("how", ["crash", "clean"])
def test_a_crashing_rank_still_flushes_and_says_it_failed(tmp_path: Path, how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path), how], env=env, timeout=120, capture_output=True, text=True)
    assert done.returncode == (1 if how == "crash" else 0), done.stderr
    assert (tmp_path / "points").read_text() == "1"
    assert (tmp_path / "closed").read_text() == ("failed" if how == "crash" else "finished")


def test_other_ranks_write_no_tensorboard_files(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHYARD_RUN_DIR": str(tmp_path), "RANK": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=120, cwd=tmp_path)
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "events.jsonl").exists()


class StuckSink:
    """A tracking server that does not answer until released."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.received: list[Point] = []
        self.closed = False

    def open(self) -> None:
        pass

    def write(self, points: Sequence[Point]) -> None:
        self.release.wait()
        self.received.extend(points)

    def close(self, failed: bool = False) -> None:
        self.closed = True


class BrokenSink(StuckSink):
    name = "broken"

    def write(self, points: Sequence[Point]) -> None:
        raise ConnectionError("tracking server down")


def test_a_stuck_sink_never_blocks_put_and_drops_what_does_not_fit() -> None:
    stuck, broken = StuckSink(), BrokenSink()
    runner = SinkRunner([stuck, broken], max_queued=50, batch=10)
    # The sink is blocked for the whole loop: were put() to wait for it, this loop would never end.
    for step in range(1, 1001):
        runner.put(step, {"train/loss": 1.0 / step})
    assert runner.dropped >= 1000 - 50 - 10
    stuck.release.set()
    runner.close()
    assert stuck.closed and not broken.closed  # a failing sink is dropped, the others go on
    assert len(stuck.received) == 1000 - runner.dropped
    steps = [s for s, _ in stuck.received]
    assert steps == sorted(steps) and steps[0] == 1  # in order, oldest first
