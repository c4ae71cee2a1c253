"""``metrics.from_output`` templates: a line printed with Python's own formatting reads back as the numbers that
were formatted, at the step printed; a template that could not work is refused in words that say how to fix it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobspec.output_metrics import OutputReader, compile_template, template_problem

NANOGPT = "iter {step}: loss {train/loss}, time {time_ms}ms, mfu {mfu}%"
WORD_LANGUAGE_MODEL = "| epoch {epoch} | {step}/ {_} batches | lr {lr} | ms/batch {ms} | loss {loss} | ppl {ppl}"


def _points(template: str, line: str) -> list[tuple[str, int, float]]:
    return OutputReader([compile_template(template)]).points(line)


def test_the_lines_of_public_scripts_read_back_as_their_numbers() -> None:
    # nanoGPT's train.py and pytorch/examples' word_language_model/main.py, as they print.
    assert _points(NANOGPT, "iter 10: loss 4.2345, time 120.00ms, mfu -100.00%") == [
        ("train/loss", 10, 4.2345), ("time_ms", 10, 120.0), ("mfu", 10, -100.0)]
    line = "| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 45.24 | loss  7.60 | ppl  2000.59"
    assert _points(WORD_LANGUAGE_MODEL, line) == [
        ("epoch", 200, 1.0), ("lr", 200, 20.0), ("ms", 200, 45.24), ("loss", 200, 7.6), ("ppl", 200, 2000.59)]
    # Anywhere in a line, every time it matches, and not in a line of another shape.
    assert _points("step {step} loss {loss}", "[12:00] step 3 loss 0.5; step 4 loss 0.25") == [
        ("loss", 3, 0.5), ("loss", 4, 0.25)]
    assert _points(NANOGPT, "step 10: train loss 4.2, val loss 4.3") == []
    # A diverged loss is a number too (a gap in the curve once stored), and braces the line has are written twice.
    [(_, _, value)] = _points("{{step={step}}} loss={loss}", "{step=7} loss=nan")
    assert math.isnan(value)


def test_a_template_without_a_step_numbers_its_matches_in_order() -> None:
    # A script that prints no step at all (or one that starts again each epoch): the matches are its steps.
    reader = OutputReader([compile_template("loss: {loss}")])
    assert reader.points("loss: 0.5 | loss: 0.25") == [("loss", 1, 0.5), ("loss", 2, 0.25)]
    assert reader.points("loss: 0.125") == [("loss", 3, 0.125)]
    assert [step for step, _ in compile_template("loss: {loss}").readings("loss: 0.5")] == [None]


def test_a_line_without_a_step_lands_at_the_step_of_the_first_template() -> None:
    # word_language_model: a train line every 200 batches, a validation line at the end of each epoch.
    reader = OutputReader([compile_template("| loss {train/loss} |"), compile_template("| valid loss {eval/loss} |")])
    lines = ["| loss 7.0 |", "| loss 6.0 |", "| valid loss 6.5 |", "| loss 5.0 |", "| valid loss 5.5 |"]
    assert [p for line in lines for p in reader.points(line)] == [
        ("train/loss", 1, 7.0), ("train/loss", 2, 6.0), ("eval/loss", 2, 6.5), ("train/loss", 3, 5.0),
        ("eval/loss", 3, 5.5)]
    # A clock that names its step: the step-less line is at the step printed last (a resumed run's, going back).
    reader = OutputReader([compile_template("step {step} loss {loss}"), compile_template("val acc {acc}")])
    lines = ["val acc 0.1", "step 100 loss 2.0", "val acc 0.5", "step 200 loss 1.0", "step 150 loss 1.5", "val acc 0.6"]
    assert [p for line in lines for p in reader.points(line)] == [
        ("acc", 0, 0.1), ("loss", 100, 2.0), ("acc", 100, 0.5), ("loss", 200, 1.0), ("loss", 150, 1.5), ("acc", 150, 0.6)]


@given(st.lists(st.sampled_from(["train", "eval", "both"]), max_size=40), st.integers(0, 2))
def test_steps_without_a_step_follow_the_clocks_lines(kinds: list[str], clock_names_step: int) -> None:
    # However train and eval lines interleave, the clock's lines are steps 1, 2, ... (or the steps they print), each
    # eval line is at the clock's last step, and every printed value is read once.
    clock = ["loss {loss}", "it {step} loss {loss}", "loss {loss} it {step}"][clock_names_step]
    reader = OutputReader([compile_template(clock), compile_template("eval {acc}")])
    trains, got, expected = 0, [], []
    for i, kind in enumerate(kinds):
        line = ""
        if kind in ("train", "both"):
            trains += 1
            step = trains * 10 if clock_names_step else trains
            line += f"it {step} loss {i}.5 it {step}" if clock_names_step else f"loss {i}.5"
            expected.append(("loss", step, i + 0.5))
        if kind in ("eval", "both"):
            line += f" eval {i}.25"
            expected.append(("acc", (trains * 10 if clock_names_step else trains), i + 0.25))
        got.extend(reader.points(line))
    assert got == expected


def test_a_script_that_prints_its_step_on_a_line_of_its_own() -> None:
    # pytorch/examples' time_sequence_prediction: 'STEP:  3', then a 'loss:' line per LBFGS evaluation, then
    # 'test loss:'. '^' keeps 'loss: {x}' from reading the test loss line too.
    reader = OutputReader([compile_template(t) for t in ("STEP: {step}", "^loss: {train/loss}", "test loss: {eval/loss}")])
    lines = ["STEP:  0", "loss: 0.5", "loss: 0.25", "test loss: 0.125", "STEP:  1", "  loss: 0.0625", "test loss: 0.03"]
    assert [p for line in lines for p in reader.points(line)] == [
        ("train/loss", 0, 0.5), ("train/loss", 0, 0.25), ("eval/loss", 0, 0.125), ("train/loss", 1, 0.0625),
        ("eval/loss", 1, 0.03)]
    assert _points("^loss: {loss}", "test loss: 0.5") == [] and _points("loss: {loss}", "test loss: 0.5") == [("loss", 1, 0.5)]
    assert _points("^{loss} loss", "  0.5 loss 0.25 loss") == [("loss", 1, 0.5)]


@pytest.mark.parametrize(("template", "says"), [
    ("{step} {step} {loss}", "named twice"),
    ("loss {loss} avg {loss}", "named twice"),
    ("loss {_}", "names no metric"),
    ("^", "names no metric"),
    ("{step}{loss}", "nothing between them"),
    ("step {step} loss {the loss}", "is no metric name"),
    ("step {step} loss {loss", "a lone '{'"),
    ("step {step} loss} {loss}", "a lone '}'"),
])
def test_a_template_that_cannot_work_says_why(template: str, says: str) -> None:
    problem = template_problem(template)
    assert problem is not None and says in problem, problem


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_/.", min_size=1, max_size=12).filter(lambda n: n not in ("step", "_"))
_separators = st.text(alphabet="abc :,|=%-", min_size=1, max_size=5).filter(lambda s: s.strip() != "" and "-" not in s[-1:])
_formats = st.sampled_from(["{}", "{:.4f}", "{:8.2f}", "{:.3e}", "{:g}"])
_values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(st.tuples(_names, _separators, _formats, _values), min_size=1, max_size=4, unique_by=lambda t: t[0]),
       st.integers(0, 10**9), st.text(alphabet="xyz[]: ", max_size=8))
def test_a_line_printed_with_python_formatting_reads_back_as_the_numbers_formatted(
        metrics: list[tuple[str, str, str, float]], step: int, before: str) -> None:
    template = "step {step}" + "".join(f"{sep}{{{name}}}" for name, sep, _, _ in metrics)
    line = before + f"step {step}" + "".join(f"{sep}{fmt.format(value)}" for _, sep, fmt, value in metrics)
    expected = [(name, step, float(fmt.format(value))) for name, _, fmt, value in metrics]
    assert _points(template, line) == expected
