"""Rank 0's printed lines, as the ranks' merged log holds them, become metric points through the spec's templates:
only rank 0's, only whole lines, each once, every attempt's log oldest first (a resumed attempt's values are the
last offered at its steps), a template without a step numbering its lines in order and a validation line landing at
the train step it follows, and a log swapped for a link or a FIFO is never read."""

from __future__ import annotations

import os
from pathlib import Path

from jobspec.output_metrics import compile_template
from worker.found import MetricTails
from worker.output_tail import OutputMetricsTail

NANOGPT = compile_template("iter {step}: loss {train/loss}, time {time_ms}ms, mfu {mfu}%")


def _log(run_dir: Path, attempt: int) -> Path:
    path = run_dir / "logs" / f"attempt-{attempt}" / "ranks.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _read(tail: OutputMetricsTail) -> list[tuple[str, int, float]]:
    points = tail.read(force_scan=True)
    tail.ack(len(points))
    return [(p.name, p.step, p.value) for p in points]


def test_rank_zeros_whole_lines_become_points_once(tmp_path: Path) -> None:
    log = _log(tmp_path, 1)
    _append(log, "[rank 0] starting at iter 0\n[rank 1] iter 1: loss 9.0000, time 1.00ms, mfu 1.00%\n"
                 "[rank 0] iter 1: loss 4.2000, time 120.00ms, mfu -100.00%\n[rank 0] iter 2: loss 4.1")
    tail = OutputMetricsTail(tmp_path, [NANOGPT], rescan_s=0)
    assert _read(tail) == [("train/loss", 1, 4.2), ("time_ms", 1, 120.0), ("mfu", 1, -100.0)]
    assert _read(tail) == []  # the cut-off line waits for its end
    _append(log, "000, time 110.00ms, mfu 2.50%\n")
    assert _read(tail) == [("train/loss", 2, 4.1), ("time_ms", 2, 110.0), ("mfu", 2, 2.5)]


def test_points_not_stored_are_offered_again(tmp_path: Path) -> None:
    _append(_log(tmp_path, 1), "[rank 0] iter 1: loss 4.2000, time 1.00ms, mfu 1.00%\n")
    tail = OutputMetricsTail(tmp_path, [NANOGPT], rescan_s=0)
    assert len(tail.read()) == 3
    assert len(tail.read()) == 3  # the database blipped: nothing acknowledged, nothing lost
    tail.ack(3)
    assert tail.read() == []


def test_every_attempt_is_read_oldest_first_so_the_resumed_values_are_the_last_offered(tmp_path: Path) -> None:
    first, second = _log(tmp_path, 1), _log(tmp_path, 2)
    _append(first, "".join(f"[rank 0] iter {s}: loss {1 / s:.4f}, time 1.00ms, mfu 1.00%\n" for s in range(1, 14)))
    _append(second, "".join(f"[rank 0] iter {s}: loss {2 / s:.4f}, time 1.00ms, mfu 1.00%\n" for s in range(11, 16)))
    for attempt in (2, 10):  # attempt-10 sorts before attempt-2 by name
        _append(_log(tmp_path, attempt), "")
    last: dict[int, float] = {}
    for name, step, value in _read(OutputMetricsTail(tmp_path, [NANOGPT], rescan_s=0)):
        if name == "train/loss":
            last[step] = value
    assert last == {s: round((1 if s <= 10 else 2) / s, 4) for s in range(1, 16)}


def test_a_template_without_a_step_numbers_lines_in_order_across_epochs_and_attempts(tmp_path: Path) -> None:
    # pytorch/examples' word_language_model: the batch number starts again each epoch, so it is no step.
    template = compile_template("| epoch {epoch} | {_}/ {_} batches | lr {lr} | ms/batch {_} | loss {loss} | ppl {ppl}")

    def line(epoch: int, batch: int, loss: float) -> str:
        return (f"[rank 0] | epoch {epoch:3d} | {batch:5d}/{300:5d} batches | lr {20:02.2f} | ms/batch {45.2:5.2f} | "
                f"loss {loss:5.2f} | ppl {2.0 ** loss:8.2f}\n")

    _append(_log(tmp_path, 1), "".join(line(e, b, 9 - e - b / 100) for e in (1, 2) for b in (100, 200, 300)))
    _append(_log(tmp_path, 2), line(3, 100, 4.0))
    tail = OutputMetricsTail(tmp_path, [template], rescan_s=0)
    losses = [(step, value) for name, step, value in _read(tail) if name == "loss"]
    assert losses == [(1, 7.0), (2, 6.0), (3, 5.0), (4, 6.0), (5, 5.0), (6, 4.0), (7, 4.0)]
    _append(_log(tmp_path, 2), line(3, 200, 3.5))
    assert [(s, v) for n, s, v in _read(tail) if n == "loss"] == [(8, 3.5)]
    # A new reader (the next attempt's, a restarted worker's) numbers the same lines the same.
    again = [(s, v) for n, s, v in _read(OutputMetricsTail(tmp_path, [template], rescan_s=0)) if n == "loss"]
    assert again == [*losses, (8, 3.5)]
    # Its end-of-epoch line, printed as the script prints it, lands at the train step it follows.
    valid = compile_template("| end of epoch {_} | time: {_}s | valid loss {eval/loss} | valid ppl {eval/ppl}")
    _append(_log(tmp_path, 2), f"[rank 0] | end of epoch {3:3d} | time: {12.5:5.2f}s | valid loss {3.25:5.2f} | "
                               f"valid ppl {2.0 ** 3.25:8.2f}\n")
    read = _read(OutputMetricsTail(tmp_path, [template, valid], rescan_s=0))
    assert [(n, s, v) for n, s, v in read if n == "eval/loss"] == [("eval/loss", 8, 3.25)]
    assert [(s, v) for n, s, v in read if n == "loss"] == [*losses, (8, 3.5)]


def test_a_log_swapped_for_a_link_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    other = _log(tmp_path / "other-job", 1)
    _append(other, "[rank 0] iter 1: loss 0.1234, time 1.00ms, mfu 1.00%\n")
    job = tmp_path / "job"
    _log(job, 1).symlink_to(other)
    os.mkfifo(_log(job, 2))  # a plain open would block the worker forever
    assert _read(OutputMetricsTail(job, [NANOGPT], rescan_s=0)) == []
    # Found as a plain file, then replaced by a link: the worker keeps reading the file it opened, never the link.
    log = _log(job, 3)
    _append(log, "[rank 0] iter 1: loss 0.5000, time 1.00ms, mfu 1.00%\n")
    tail = OutputMetricsTail(job, [NANOGPT], rescan_s=0)
    assert ("train/loss", 1, 0.5) in _read(tail)
    log.unlink()
    log.symlink_to(other)
    assert _read(tail) == []


def test_a_job_without_templates_follows_no_log(tmp_path: Path) -> None:
    _append(_log(tmp_path, 1), "[rank 0] iter 1: loss 0.5000, time 1.00ms, mfu 1.00%\n")
    assert MetricTails(tmp_path, 0).read(force_scan=True) == []
    assert [p.name for p in MetricTails(tmp_path, 0, [NANOGPT]).read(force_scan=True)] == ["train/loss", "time_ms", "mfu"]
