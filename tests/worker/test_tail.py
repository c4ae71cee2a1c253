"""The events tail hands over lines until they are stored, and stops at a malformed event naming its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchyard.events import EventWriter, last_seq
from worker.tail import EventTail


def _write(path: Path, *events: object) -> None:
    with path.open("a", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def _metric(seq: int, **extra: object) -> dict[str, object]:
    return {"seq": seq, "time": 1.0, "type": "metric", "step": seq, "epoch": 0, "values": {"loss": 1.0}, **extra}


def test_lines_are_read_again_until_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write(path, _metric(1), _metric(2))
    tail = EventTail(path)
    assert [e["seq"] for e in tail.read()] == [1, 2]
    # The rows were not committed (the database blipped): the next read hands the same lines over.
    assert [e["seq"] for e in tail.read()] == [1, 2]
    tail.ack()
    _write(path, _metric(3))
    path.open("a").write('{"seq": 4, "ty')  # half-written: left for later
    assert [e["seq"] for e in tail.read()] == [3]
    tail.ack()
    assert tail.read() == []


@pytest.mark.parametrize(("bad", "why"), [
    ({"values": [1.0]}, "values is not an object"),
    ({"step": 2**63}, "step is not an integer"),
    ({"values": {"loss": "high"}}, "values['loss'] is not a number"),
])
def test_a_malformed_event_stops_the_tail_before_its_line(tmp_path: Path, bad: dict[str, object], why: str) -> None:
    path = tmp_path / "events.jsonl"
    _write(path, _metric(1), _metric(2, **bad), _metric(3))
    tail = EventTail(path)
    assert [e["seq"] for e in tail.read()] == [1]
    assert tail.bad is not None and tail.bad.line == 2 and why in tail.bad.reason
    assert str(tail.bad).startswith("events.jsonl line 2: ")


def test_last_seq_finds_the_seq_behind_a_line_longer_than_its_read_block(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path, enabled=True)
    writer.metric(1, 0, {"loss": 1.0})
    writer.status("training", note="x" * 200_000)  # one line of ~200 KB: several blocks
    assert last_seq(tmp_path / "events.jsonl") == 2
    writer.metric(2, 0, {"loss": 0.5})
    writer.status("training", note="y" * 200_000)
    (tmp_path / "events.jsonl").open("a").write('{"seq": 99, "torn')  # a torn last line is ignored
    assert last_seq(tmp_path / "events.jsonl") == 4
    # The writer of a restarted rank 0 goes on from there instead of from 1.
    assert EventWriter(tmp_path, enabled=True)._seq == 4
