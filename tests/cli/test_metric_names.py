"""Lightning's metric names fill the loss columns of `torchyard ls`, `--follow` and the dashboard as `train/loss`
does; a display mapping only, with one home (torchyard/client/metric_names.py) that the dashboard's copy is written from."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from dashboard.metric_names import JS_MODULE, js_module
from torchyard.cli.follow import FollowState
from torchyard.cli.render import jobs_table
from torchyard.client import Job, MetricEvent
from torchyard.client.metric_names import DISPLAY, shown

LIGHTNING = {"train_loss_step": 0.4321, "train_loss_epoch": 0.5, "val_loss": 0.6543, "epoch": 1.0}


def _row(job: Job) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(jobs_table([job]))
    return out.getvalue().splitlines()[-1]


def test_ls_shows_lightnings_loss_in_the_loss_column() -> None:
    job = Job(id="j1", name="lit", status="running", last_step=120, latest_metrics=LIGHTNING)
    assert "0.4321" in _row(job) and "120" in _row(job)
    assert "0.4321" not in _row(job.model_copy(update={"latest_metrics": {"val_loss": 0.6543}}))


def test_follow_shows_lightnings_loss_and_val_loss_and_keeps_the_names() -> None:
    state = FollowState(job=Job(id="j1", name="lit", status="running"), total=None)
    state.apply(MetricEvent(step=50, values={"train_loss_step": 0.25}))
    state.apply(MetricEvent(step=50, values={"val_loss": 0.75}))
    assert state.summary().startswith("step 50/?  loss 0.2500  eval_loss 0.7500")
    assert set(state.values) == {"train_loss_step", "val_loss"}  # logged names, not renamed


def test_ls_shows_a_plain_scripts_loss_and_eval_loss() -> None:
    job = Job(id="j1", name="plain", status="running", last_step=59, latest_metrics={"loss": 0.0051, "eval_loss": 0.75})
    assert "0.0051" in _row(job)
    state = FollowState(job=job, total=None)
    state.apply(MetricEvent(step=59, values={"loss": 0.0051, "eval_loss": 0.75}))
    assert state.summary().startswith("step 59/?  loss 0.0051  eval_loss 0.7500")


@given(st.dictionaries(st.sampled_from(["train/loss", "train_loss_step", "train_loss", "loss", "val_loss", "eval/loss",
                                        "eval_loss", "val/loss", "lr"]),
                       st.floats(allow_nan=False)))
def test_the_first_logged_name_of_a_column_fills_it(values: dict[str, float]) -> None:
    for column, names in DISPLAY.items():
        present = [values[n] for n in names if n in values]
        assert shown(values, column) == (present[0] if present else None)
    assert shown(values, "lr") == values.get("lr")  # a name without a mapping shows itself


def test_the_dashboards_copy_is_written_from_the_one_home() -> None:
    assert JS_MODULE.read_text() == js_module(), "run `python -m dashboard.metric_names`"
