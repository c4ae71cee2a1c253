"""The reporting SDK for script jobs: events.jsonl on rank 0 under torchyard, a no-op elsewhere, resume_path()."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from torchyard import report


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(report.RUN_DIR_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(report.RESUME_FROM_ENV, raising=False)
    yield
    report.close()


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_outside_torchyard_everything_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report.metrics(1, loss=0.5)
    report.checkpoint("snapshot.pt", 1)
    assert report.resume_path() is None
    assert not report.enabled()
    assert list(tmp_path.iterdir()) == []


def test_rank_zero_writes_the_events_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    report.metrics(1, {"train/loss": 2.0}, epoch=0, lr=0.1)
    report.metrics(2, loss=float("nan"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "s2.pt").write_bytes(b"x")
    report.checkpoint("ckpt/s2.pt", 2, epoch=0, loss=1.5)
    got = events(tmp_path)
    assert [e["seq"] for e in got] == [1, 2, 3]
    assert got[0]["type"] == "metric" and got[0]["step"] == 1 and got[0]["epoch"] == 0
    assert got[0]["values"] == {"train/loss": 2.0, "lr": 0.1}
    assert got[1]["values"] == {"loss": None}  # NaN is stored as null
    assert {k: got[2][k] for k in ("type", "step", "epoch", "path", "loss")} == {
        "type": "checkpoint", "step": 2, "epoch": 0, "path": "ckpt/s2.pt", "loss": 1.5}
    assert report.resume_path() == str(tmp_path / "ckpt" / "s2.pt")


def test_other_ranks_write_nothing_but_can_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.RUN_DIR_ENV, str(tmp_path))
    (tmp_path / "a.pt").write_bytes(b"a")
    (tmp_path / "events.jsonl").write_text(json.dumps({"seq": 4, "type": "checkpoint", "step": 5, "path": "a.pt"}) + "\n")
    monkeypatch.setenv("RANK", "1")
    report.metrics(6, loss=1.0)
    report.checkpoint(tmp_path / "a.pt", 6)
    assert len(events(tmp_path)) == 1
    assert report.resume_path() == str(tmp_path / "a.pt")


def test_resume_path_is_the_newest_reported_checkpoint_that_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(report.RUN_DIR_ENV, str(tmp_path))
    assert report.resume_path() is None  # fresh run: no events yet
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.pt"
    outside.write_bytes(b"o")
    (tmp_path / "one.pt").write_bytes(b"1")
    lines = [
        {"seq": 1, "type": "checkpoint", "step": 10, "path": "one.pt"},
        {"seq": 2, "type": "metric", "step": 11, "values": {"loss": 1.0}},
        {"seq": 3, "type": "checkpoint", "step": 20, "path": str(outside)},  # absolute, outside the run dir
        {"seq": 4, "type": "checkpoint", "step": 30, "path": "deleted.pt"},  # gone: skipped
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"seq\": 5, \"type\": \"checkp")
    assert report.resume_path() == str(outside)
    # A new writer continues the seq after what earlier attempts wrote, past the torn line.
    monkeypatch.setenv("RANK", "0")
    report.metrics(31, loss=0.5)
    assert events_tail(tmp_path)["seq"] == 5


def test_a_retried_job_resumes_from_the_inherited_checkpoint_until_it_has_its_own(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    old = tmp_path / "old-job" / "epoch_0002.pt"
    old.parent.mkdir()
    old.write_bytes(b"o")
    monkeypatch.setenv(report.RUN_DIR_ENV, str(run))
    monkeypatch.setenv(report.RESUME_FROM_ENV, str(old))
    assert report.resume_path() == str(old)
    monkeypatch.setenv("RANK", "0")
    (run / "mine.pt").write_bytes(b"m")
    report.checkpoint(run / "mine.pt", 3)
    assert report.resume_path() == str(run / "mine.pt")


def events_tail(run_dir: Path) -> dict:
    last = (run_dir / "events.jsonl").read_text().splitlines()[-1]
    return json.loads(last)


def test_bad_values_fail_fast_even_outside_torchyard() -> None:
    with pytest.raises(TypeError, match="step"):
        report.metrics(-1, loss=1.0)
    with pytest.raises(TypeError, match="step"):
        report.metrics(1.5, loss=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'loss'"):
        report.metrics(1, loss="low")
    with pytest.raises(TypeError, match="seq"):
        report.checkpoint("x.pt", 1, seq=3)
    report.metrics(1, step=3.0, epoch=1)  # a metric may be called "step"; epoch is the keyword


def test_importing_the_sdk_does_not_import_torch() -> None:
    probe = "import sys; from torchyard import report; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT)
