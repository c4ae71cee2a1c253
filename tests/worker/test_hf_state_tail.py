"""A Hugging Face ``Trainer`` script that reports to nothing (transformers 5's default) still has metrics: the
``log_history`` its checkpoints' ``trainer_state.json`` keep reads back as the very points its TensorBoard
callback would have written, each once however many checkpoints repeat it, and a script that does report to
TensorBoard gets each point once from both. The state files here are written by transformers' own classes."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from jobs.settings import Settings
from jobs.store.models import MetricPoint
from tests.helpers import plain_db, session_with_job
from worker.found import Found
from worker.hf_state_tail import TrainerStateTail, history_points, metric_name
from worker.run_files import Point
from worker.tb_tail import TensorBoardTail

transformers = pytest.importorskip("transformers")


class LoggingTrainer:
    """What ``Trainer.log`` does with each call, on transformers' own ``TrainerState``, with its TensorBoard callback
    writing beside it when ``tensorboard`` is given; ``save`` writes a checkpoint's state file as the Trainer does."""

    def __init__(self, output_dir: Path, tensorboard: Path | None = None):
        from transformers import TrainerControl, TrainerState, TrainingArguments

        self.output_dir = output_dir
        self.state = TrainerState(is_world_process_zero=True, is_local_process_zero=True)
        self.args = TrainingArguments(output_dir=str(output_dir), report_to="none")
        self.control = TrainerControl()
        self.callback = None
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter
            from transformers.integrations import TensorBoardCallback

            self.callback = TensorBoardCallback(SummaryWriter(str(tensorboard)))

    def log(self, step: int, logs: dict[str, Any]) -> None:
        self.state.global_step = step
        self.state.epoch = step / 10
        logs = {**logs, "epoch": self.state.epoch}
        self.state.log_history.append({**logs, "step": step})
        if self.callback is not None:
            self.callback.on_log(self.args, self.state, self.control, logs=dict(logs))

    def train(self, steps: range, lr: float = 5e-4) -> None:
        for step in steps:
            self.log(step, {"loss": round(1.0 / step, 4), "grad_norm": 0.1 * step + 1 / 3, "learning_rate": lr * (1 - step / 100)})
            if step % 4 == 0:
                self.log(step, {"eval_loss": 2.0 / step, "eval_runtime": 0.25, "eval_samples_per_second": 812.5})

    def save(self, name: str | None = None) -> Path:
        """``checkpoint-<step>/trainer_state.json``, or ``name`` in the output directory (``save_state``)."""
        folder = self.output_dir / f"checkpoint-{self.state.global_step}" if name is None else self.output_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (name or "trainer_state.json")
        self.state.save_to_json(str(path))
        return path

    def close(self) -> None:
        if self.callback is not None:
            self.callback.on_train_end(self.args, self.state, self.control)


def _read(tail: TrainerStateTail | TensorBoardTail) -> list[Point]:
    points = tail.read(force_scan=True)
    tail.ack(len(points))
    return points


def _triples(points: list[Point]) -> list[tuple[str, int, float]]:
    return sorted((p.name, p.step, p.value) for p in points)


def test_the_log_history_reads_back_as_the_points_the_tensorboard_callback_writes(tmp_path: Path) -> None:
    trainer = LoggingTrainer(tmp_path / "workdir" / "out", tensorboard=tmp_path / "workdir" / "out" / "runs" / "x")
    trainer.train(range(1, 9))
    trainer.save()
    trainer.close()
    from_state = _read(TrainerStateTail(tmp_path / "workdir", rescan_s=0))
    from_events = _read(TensorBoardTail(tmp_path / "workdir", rescan_s=0))
    assert _triples(from_state) == _triples(from_events)
    names = {p.name for p in from_state}
    assert {"train/loss", "train/grad_norm", "train/learning_rate", "train/epoch", "eval/loss", "eval/runtime"} <= names
    assert [p.step for p in from_state if p.name == "train/loss"] == list(range(1, 9))
    assert [p.step for p in from_state if p.name == "eval/loss"] == [4, 8]


def test_each_point_is_read_once_however_many_checkpoints_repeat_it(tmp_path: Path) -> None:
    trainer = LoggingTrainer(tmp_path / "out")
    tail = TrainerStateTail(tmp_path, rescan_s=0)
    trainer.train(range(1, 5))
    first = trainer.save()
    assert [p.step for p in _read(tail) if p.name == "train/loss"] == [1, 2, 3, 4]
    trainer.train(range(5, 9))
    trainer.save()
    assert [p.step for p in _read(tail) if p.name == "train/loss"] == [5, 6, 7, 8]
    # The older checkpoint is not followed once a newer one was read: a run keeping every checkpoint never fills
    # the files a tail follows, and the older one is not read again at later scans.
    assert first not in tail.files and _read(tail) == []
    # save_state() at the end: the output directory's own file, whose new entries are the run's summary.
    trainer.log(8, {"train_runtime": 12.5, "train_loss": 0.41, "total_flos": 1.5e12})
    trainer.save("trainer_state.json")
    # (train/epoch at step 8 was read already.)
    assert _triples(_read(tail)) == [("train/total_flos", 8, _f32(1.5e12)), ("train/train_loss", 8, _f32(0.41)),
                                     ("train/train_runtime", 8, 12.5)]


def test_a_resumed_run_s_new_values_replace_the_first_attempts_and_an_old_checkpoint_does_not_bring_them_back(
        tmp_path: Path) -> None:
    first = LoggingTrainer(tmp_path / "out")
    first.train(range(1, 5))
    first.save()
    first.train(range(5, 10))
    first.save()  # checkpoint-9: steps 1..9 of the first attempt
    # The next attempt loads checkpoint-4 (as if 9 were damaged) and trains 5..12 again with another rate.
    second = LoggingTrainer(tmp_path / "out")
    second.state.log_history = [dict(e) for e in first.state.log_history if e["step"] <= 4]
    second.train(range(5, 13), lr=1e-3)
    second.save()  # checkpoint-12
    points = _read(TrainerStateTail(tmp_path, rescan_s=0))
    rates = {p.step: p.value for p in points if p.name == "train/learning_rate"}
    assert [rates[s] for s in (4, 5, 9, 12)] == [_f32(5e-4 * 0.96), _f32(1e-3 * 0.95), _f32(1e-3 * 0.91), _f32(1e-3 * 0.88)]
    # Whatever the order within a read, the last value offered at a step is the newer checkpoint's.
    last: dict[tuple[str, int], float] = {}
    for p in points:
        last[(p.name, p.step)] = p.value
    assert last[("train/learning_rate", 9)] == _f32(1e-3 * 0.91)


def test_a_state_file_cut_off_mid_write_is_read_once_whole(tmp_path: Path) -> None:
    trainer = LoggingTrainer(tmp_path / "src")
    trainer.train(range(1, 4))
    whole = trainer.save().read_bytes()
    target = tmp_path / "job" / "out" / "checkpoint-3" / "trainer_state.json"
    target.parent.mkdir(parents=True)
    target.write_bytes(whole[: len(whole) // 2])
    tail = TrainerStateTail(tmp_path / "job", rescan_s=0)
    assert _read(tail) == []
    target.write_bytes(whole)
    assert [p.step for p in _read(tail) if p.name == "train/loss"] == [1, 2, 3]


def test_a_link_or_a_fifo_in_a_state_files_place_is_not_read(tmp_path: Path) -> None:
    other = LoggingTrainer(tmp_path / "other-job" / "out")
    other.train(range(1, 3))
    secret = other.save()
    job = tmp_path / "job"
    (job / "out" / "checkpoint-2").mkdir(parents=True)
    (job / "out" / "checkpoint-2" / "trainer_state.json").symlink_to(secret)
    (job / "out" / "checkpoint-4").mkdir()
    os.mkfifo(job / "out" / "checkpoint-4" / "trainer_state.json")  # a plain open would block forever
    tail = TrainerStateTail(job, rescan_s=0)
    assert _read(tail) == []
    # A file found as a plain one and swapped for a link afterwards is not followed either.
    mine = LoggingTrainer(job / "mine")
    mine.train(range(1, 3))
    path = mine.save()
    assert {p.step for p in _read(tail)} == {1, 2}
    path.unlink()
    path.symlink_to(secret)
    assert _read(tail) == []


def test_a_script_reporting_to_tensorboard_too_gets_each_point_once(settings: Settings, tmp_path: Path) -> None:
    trainer = LoggingTrainer(tmp_path / "workdir" / "out", tensorboard=tmp_path / "workdir" / "out" / "runs" / "x")
    trainer.train(range(1, 9))
    trainer.save()
    trainer.close()
    with session_with_job(settings, tmp_path) as (session, job):
        def rows() -> list[tuple[str, int, int]]:
            return sorted(session.exec(sa.select(MetricPoint.name, MetricPoint.step, MetricPoint.seq).where(
                MetricPoint.job_id == job.id)).all())

        Found(tmp_path).ingest(session, job.id, [], plain_db, batch=500, final=True)
        stored = rows()
        assert [step for name, step, _ in stored if name == "train/loss"] == list(range(1, 9))
        assert len(stored) == len({(p.name, p.step) for p in _read(TensorBoardTail(tmp_path, rescan_s=0))})
        # Both files read again (the next attempt's first tick): nothing is stored again, no new seq for followers.
        Found(tmp_path).ingest(session, job.id, [], plain_db, batch=500, final=True)
        assert rows() == stored


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


_keys = st.text(alphabet="abcdefghijklmnop_", min_size=1, max_size=12)
_values = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-10**6, 10**6), st.booleans(),
                    st.text(max_size=4), st.none())
_entries = st.dictionaries(_keys, _values, max_size=6).flatmap(
    lambda d: st.one_of(st.integers(0, 10**6), st.just(None), st.floats(0, 10)).map(lambda s: {**d, "step": s}))


@given(st.lists(_entries, max_size=8))
def test_every_number_logged_at_a_step_is_one_point_under_the_callbacks_name(history: list[dict[str, Any]]) -> None:
    points = history_points(history, when=1.0)
    expected = [(metric_name(k), e["step"], float(v)) for e in history if type(e["step"]) is int
                for k, v in e.items() if k != "step" and type(v) in (int, float)]
    assert [(p.name, p.step, p.value) for p in points] == [(n, s, _f32(v)) for n, s, v in expected]
    assert all(math.isfinite(p.value) for p in points)
    assert all(not p.name.startswith(("train/eval_", "train/test_")) for p in points)
