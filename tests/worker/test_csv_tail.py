"""Lightning's ``CSVLogger`` file, ``metrics.csv``, read as it grows: the real logger writes it, every value comes back
once at its step, including across the rewrite Lightning does when a new key widens the header; timm's
``summary.csv`` at its epochs, a resumed run's rewritten rows read again; only whole lines
count, a file of another shape gives nothing, and a link or a FIFO in its place is not read."""

from __future__ import annotations

import contextlib
import csv
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.csv_tail import CsvLoggerTail, row_points
from worker.found import MetricTails


def _read(tail: CsvLoggerTail) -> list[tuple[str, int, float]]:
    points = tail.read(force_scan=True)
    tail.ack(len(points))
    return sorted((p.name, p.step, p.value) for p in points)


@pytest.fixture
def logger_cls() -> type:
    return pytest.importorskip("lightning.fabric.loggers").CSVLogger


def test_what_the_csv_logger_writes_comes_back_once_across_its_header_rewrite(tmp_path: Path, logger_cls: type) -> None:
    logger = logger_cls(str(tmp_path / "workdir"), flush_logs_every_n_steps=1)
    tail = CsvLoggerTail(tmp_path, rescan_s=0)
    for step in range(4):
        logger.log_metrics({"train_loss": 1.0 / (step + 1), "epoch": 0}, step=step)
        logger.save()
    assert _read(tail) == sorted([("train_loss", s, 1.0 / (s + 1)) for s in range(4)] + [("epoch", s, 0.0) for s in range(4)])
    # val_loss is new: Lightning writes the whole file again under the wider header. Only what is new comes back.
    logger.log_metrics({"val_loss": 0.5, "epoch": 0}, step=3)
    logger.log_metrics({"train_loss": 0.2, "epoch": 1}, step=4)
    logger.save()
    header = (tmp_path / "workdir" / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert header == "epoch,step,train_loss,val_loss"
    assert _read(tail) == [("epoch", 4, 1.0), ("train_loss", 4, 0.2), ("val_loss", 3, 0.5)]
    assert _read(tail) == []
    logger.finalize("success")


def test_a_row_cut_off_mid_write_waits_and_a_file_of_another_shape_gives_nothing(tmp_path: Path) -> None:
    path = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text("epoch,step,train_loss\n0,0,0.9\n0,1,0.")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.csv").write_text("name,value\nloss,0.5\n")  # no step column
    tail = CsvLoggerTail(tmp_path, rescan_s=0)
    assert _read(tail) == [("epoch", 0, 0.0), ("train_loss", 0, 0.9)]
    with open(path, "a") as f:
        f.write("8\n")
    assert _read(tail) == [("epoch", 1, 0.0), ("train_loss", 1, 0.8)]


def test_a_link_or_a_fifo_in_the_files_place_is_not_read(tmp_path: Path) -> None:
    other = tmp_path / "other" / "metrics.csv"
    other.parent.mkdir()
    other.write_text("step,secret\n0,42\n")
    job = tmp_path / "job"
    job.mkdir()
    (job / "metrics.csv").symlink_to(other)
    (job / "sub").mkdir()
    os.mkfifo(job / "sub" / "metrics.csv")  # a plain open would block the worker forever
    assert _read(CsvLoggerTail(job, rescan_s=0)) == []
    (job / "metrics.csv").unlink()
    (job / "metrics.csv").write_text("step,loss\n0,0.5\n")
    tail = CsvLoggerTail(job, rescan_s=0)
    assert _read(tail) == [("loss", 0, 0.5)]
    (job / "metrics.csv").unlink()
    (job / "metrics.csv").symlink_to(other)
    assert _read(tail) == []


def _timm_epoch(path: Path, epoch: int, scale: float) -> None:
    """A row as timm's train.py appends it to summary.csv at the end of an epoch (csv's default dialect: CRLF)."""
    row = {"epoch": epoch, "train_loss": scale / (epoch + 1), "eval_loss": 1.25 * scale / (epoch + 1), "eval_top1": 10.0 * epoch,
           "eval_top5": 30.0 + epoch, "lr": 0.1 * scale}
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def test_timms_summary_is_read_at_its_epochs_and_a_resumed_runs_rows_replace_the_trimmed_ones(tmp_path: Path) -> None:
    summary = tmp_path / "workdir" / "output" / "train" / "20261207-resnet18" / "summary.csv"
    summary.parent.mkdir(parents=True)
    tail = CsvLoggerTail(tmp_path, rescan_s=0)
    for epoch in range(3):
        _timm_epoch(summary, epoch, 2.0)
    points = _read(tail)
    assert [(s, v) for n, s, v in points if n == "train_loss"] == [(0, 2.0), (1, 1.0), (2, 2.0 / 3)]
    assert {n for n, _, _ in points} == {"train_loss", "eval_loss", "eval_top1", "eval_top5", "lr"}  # epoch: the step
    # Resumed from epoch 1: timm first writes the file again with the rows before it, then appends epochs 1.. anew,
    # which can leave it longer than it was: the rows past the kept ones are read again, not skipped.
    with open(summary, newline="") as f:
        header, first, *_ = list(csv.reader(f))
    with open(summary, "w", newline="") as f:
        csv.writer(f).writerows([header, first])
    for epoch in (1, 2, 3):
        _timm_epoch(summary, epoch, 1.0)
    assert [(s, v) for n, s, v in _read(tail) if n == "train_loss"] == [(1, 0.5), (2, 1.0 / 3), (3, 0.25)]


def test_the_metric_tails_read_csv_files_with_the_others(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("step,loss\n3,0.5\n")
    assert [(p.name, p.step) for p in MetricTails(tmp_path, 0).read(force_scan=True)] == [("loss", 3)]


_cells = st.one_of(st.just(""), st.floats(allow_nan=False).map(repr), st.integers(-10**9, 10**9).map(str), st.text(max_size=3))


@given(st.lists(st.text(alphabet="abcxyz_/", min_size=1, max_size=6), min_size=1, max_size=5, unique=True),
       st.data())
def test_a_row_gives_each_number_in_it_at_its_step(names: list[str], data: st.DataObject) -> None:
    header = [*names, "step"] if "step" not in names else names
    row = [data.draw(_cells) for _ in header[:-1]] + [str(data.draw(st.integers(0, 2**31 - 1)))]
    expected = []
    for name, cell in zip(header[:-1], row[:-1], strict=True):
        with contextlib.suppress(ValueError):
            expected.append((name, int(row[-1]), float(cell)))
    assert [(p.name, p.step, p.value) for p in row_points(header, row, 0.0)] == expected
    assert row_points(header, row[:-1], 0.0) == []  # a row of another width
