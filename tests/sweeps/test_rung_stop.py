"""Where a trial stops by itself: at exactly the rung it may train to (jobs.sweeps.asha.pause_at), read by the
trainer from its environment (trainer.preemption.pause_step)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobs.sweeps.asha import pause_at
from jobs.sweeps.spec import AshaSpec, trial_spec
from tests.sweeps.test_policy import sweep
from trainer.preemption import pause_step

ashas = st.builds(AshaSpec, resource=st.sampled_from(["steps", "epochs"]), min_resource=st.integers(1, 500),
                  reduction_factor=st.integers(2, 5), rungs=st.integers(1, 6))


@given(ashas, st.integers(0, 8))
def test_a_trial_stops_at_its_rungs_resource_and_trains_to_the_end_at_the_last(asha: AshaSpec, allowed: int) -> None:
    at = pause_at(asha, allowed)
    if allowed >= asha.rungs - 1:
        assert at is None  # the last rung: max_resource, the end of its schedule
    else:
        assert at == asha.min_resource * asha.reduction_factor ** allowed
        assert at < asha.max_resource


@given(ashas, st.integers(0, 7))
def test_a_promotion_moves_the_stop_to_the_next_rung(asha: AshaSpec, allowed: int) -> None:
    now, then = pause_at(asha, allowed), pause_at(asha, allowed + 1)
    if now is not None:
        assert then is None or then == now * asha.reduction_factor


def test_max_steps_stays_the_schedules_horizon_whatever_the_rung() -> None:
    """The stop comes from the rung, not the spec: every trial's learning rate decays over asha.max_resource."""
    asha = AshaSpec(min_resource=20, reduction_factor=3, rungs=3)
    spec = trial_spec(sweep(method="asha", max_trials=9, asha=asha.model_dump()), {"train.lr": 0.1}, "sw", 0)
    assert spec["train"]["max_steps"] == 180 and spec["eval"]["every_steps"] == 20
    assert [pause_at(asha, k) for k in range(3)] == [20, 60, None]


@given(st.sampled_from(["steps", "epochs"]), st.integers(1, 1000), st.integers(1, 50), st.integers(1, 5000))
def test_the_trainer_stops_at_the_step_it_is_told_and_never_past_its_end(unit: str, n: int, per_epoch: int,
                                                                            total: int) -> None:
    step = pause_step(f"{unit}:{n}", per_epoch, total)
    want = n if unit == "steps" else n * per_epoch
    assert step == (want if want < total else None)


@given(st.sampled_from([None, "", "steps", "steps:", "steps:x", "steps:0", "steps:-3", "hours:4", "epochs:1.5"]))
def test_a_stop_the_trainer_cannot_read_is_ignored(raw: str | None) -> None:
    assert pause_step(raw, 10, 1000) is None
