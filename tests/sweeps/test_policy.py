"""The sweep policy without processes: search spaces, sampling and asynchronous successive halving."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobs.sweeps.asha import Decision, TrialState, bracket_of, decide, quota
from jobs.sweeps.sampling import grid, params_of
from jobs.sweeps.spec import SweepSpec, set_path, trial_spec
from tests.quick_examples import examples

BASE = {"name": "base", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"}}


def sweep(**overrides: object) -> SweepSpec:
    values: dict = {"name": "s", "spec": BASE, "space": {"train.lr": {"type": "choice", "values": [0.1, 0.01]}},
                    "method": "grid", "metric": "eval/loss"}
    values.update(overrides)
    return SweepSpec.model_validate(values)


@given(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=4, unique=True), min_size=1, max_size=4))
def test_grid_is_the_cartesian_product(choices: list[list[int]]) -> None:
    space = {f"model.args.p{i}": {"type": "choice", "values": values} for i, values in enumerate(choices)}
    points = grid(sweep(space=space).space)
    assert len(points) == math.prod(len(c) for c in choices)
    assert {tuple(p.values()) for p in points} == set(itertools.product(*choices))


@given(st.integers(0, 2**31 - 1), st.integers(0, 50))
def test_random_draws_are_reproducible_and_in_bounds(seed: int, n: int) -> None:
    s = sweep(method="random", max_trials=60, seed=seed, space={
        "train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
        "train.weight_decay": {"type": "uniform", "low": 0.0, "high": 0.5},
        "model.args.hidden": {"type": "int", "low": 8, "high": 64, "step": 8}})
    a, b = params_of(s, n), params_of(s, n)
    assert a == b
    assert 1e-4 <= a["train.lr"] <= 1e-1 and 0.0 <= a["train.weight_decay"] <= 0.5
    assert a["model.args.hidden"] in range(8, 65, 8)


def test_bad_spaces_are_refused_naming_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match="low must be finite and below high"):
        sweep(method="random", max_trials=2, space={"train.lr": {"type": "uniform", "low": 1, "high": 0}})
    with pytest.raises(ValidationError, match="grid needs choice or int"):
        sweep(space={"train.lr": {"type": "uniform", "low": 0, "high": 1}})
    with pytest.raises(ValidationError, match="needs asha.min_resource"):
        sweep(method="asha", max_trials=3)
    with pytest.raises(ValidationError, match="are fixed"):
        sweep(space={"queue": {"type": "choice", "values": ["a"]}})
    with pytest.raises(ValidationError, match="max_trials"):
        sweep(method="random")


def test_script_args_are_set_after_their_flag_or_appended() -> None:
    spec = {"kind": "script", "entrypoint": "t.py", "args": ["--lr", "1", "--out", "x"]}
    assert set_path(spec, "args.--lr", 0.5)["args"] == ["--lr", "0.5", "--out", "x"]
    assert set_path(spec, "args.--width", 8)["args"] == ["--lr", "1", "--out", "x", "--width", "8"]
    assert spec["args"] == ["--lr", "1", "--out", "x"]  # the base spec is left alone


def test_asha_trials_train_to_the_last_rung_and_evaluate_at_every_rung() -> None:
    s = sweep(method="asha", max_trials=9, asha={"min_resource": 10, "reduction_factor": 3, "rungs": 3})
    spec = trial_spec(s, {"train.lr": 0.1}, "SW", 4)
    assert spec["train"] == {"lr": 0.1, "max_steps": 90}
    assert spec["eval"]["every_steps"] == 10
    assert spec["labels"] == {"torchyard/sweep": "SW", "torchyard/trial": "4"}


# ---------------------------------------------------------------- ASHA as a simulation of arrivals


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 30), st.sampled_from([2, 3, 4]), st.integers(1, 4), st.integers(1, 8),
       st.data())
def test_asha_invariants_over_any_order_of_arrivals(n: int, eta: int, rungs: int, slots: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
    fails = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 3))
    brackets = data.draw(st.integers(1, rungs))
    bracket = {i: bracket_of(i, brackets) for i in range(n)}
    allowed = {i: bracket[i] for i in range(n)}  # a trial is let in at its bracket's first rung
    rung_values: dict[int, dict[int, float]] = {i: {} for i in range(n)}
    ended: set[int] = set()
    stopped: set[int] = set()
    promoted: list[tuple[int, int]] = []
    created = 0
    running: set[int] = set()
    for _ in range(20 * n * rungs):
        # Create trials while slots are free, then one running trial (chosen by the test) makes progress.
        while created < n and len(running) < slots:
            running.add(created)
            created += 1
        if running:
            t = data.draw(st.sampled_from(sorted(running)))
            running.discard(t)
            if t in fails and not rung_values[t]:
                ended.add(t)
            else:
                rung = allowed[t]
                assert rung >= bracket[t], "paused below its bracket's first rung"
                rung_values[t][rung] = values[t] + rung  # worse later never matters; distinct per rung
                if rung == rungs - 1:
                    ended.add(t)
        states = [TrialState(i, dict(rung_values[i]), allowed[i], paused=i < created and i not in running and i not in ended
                             and allowed[i] in rung_values[i], ended=i in ended) for i in range(created)]
        d = decide(states, eta=eta, rungs=rungs, mode="min", all_created=created == n, free_slots=slots - len(running),
                   brackets=brackets)
        assert len(d.promote) <= slots - len(running)
        assert not ({t for t, _ in d.promote} & set(d.stop))
        for t, rung in d.promote:
            assert states[t].paused and allowed[t] == rung
            assert (t, rung) not in promoted
            promoted.append((t, rung))
            allowed[t] = rung + 1
            running.add(t)
            # Each bracket promotes from a rung at most its own share of the trials of that bracket there.
            peers = [i for i in range(n) if bracket[i] == bracket[t]]
            reached = sum(1 for i in peers if i < created and rung in rung_values[i])
            final = created == n and all(rung in rung_values[i] or i in ended for i in peers)
            assert sum(1 for u, r in promoted if r == rung and bracket[u] == bracket[t]) <= quota(reached, eta, final)
            assert quota(reached, eta, final) <= math.ceil(reached / eta)
        for t in d.stop:
            assert t not in stopped and states[t].paused
            assert (t, allowed[t]) not in promoted  # never stopped at a rung it was promoted from
            stopped.add(t)
            ended.add(t)
        if len(ended) == n:
            break
    assert len(ended) == n, "the sweep never finished"
    for b in range(brackets):
        peers = [i for i in range(n) if bracket[i] == b]
        if set(peers) - fails:
            assert any(rungs - 1 in rung_values[i] for i in peers), f"no trial of bracket {b} reached the last rung"


def _states(data: st.DataObject, n: int, rungs: int, brackets: int) -> list[TrialState]:
    """Trials of a sweep as they might stand: each somewhere between its bracket's first rung and the last."""
    out = []
    for i in range(n):
        first = bracket_of(i, brackets)
        top = data.draw(st.integers(first - 1, rungs - 1))  # first - 1: not at any rung yet
        ended = data.draw(st.booleans()) if top == first - 1 or top == rungs - 1 else data.draw(st.sampled_from([False, False, True]))
        paused = top >= first and not ended and top < rungs - 1 and data.draw(st.booleans())
        allowed = top if paused or ended or top < first else data.draw(st.sampled_from([top, min(top + 1, rungs - 1)]))
        values = {k: data.draw(st.sampled_from([0.0, 1.0, 2.0, 3.0])) for k in range(first, top + 1)}
        out.append(TrialState(i, values, max(allowed, first), paused=paused, ended=ended))
    return out


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 30), st.sampled_from([2, 3, 4]), st.integers(1, 5), st.booleans(), st.data())
def test_brackets_are_ashas_of_their_own(n: int, eta: int, rungs: int, all_created: bool, data: st.DataObject) -> None:
    # With slots for all, the decision over several brackets is each bracket's own decision as plain ASHA (one
    # bracket) over its trials alone: no trial is ranked against another bracket's. With one bracket there is
    # nothing to split, and the decisions are those of plain ASHA.
    brackets = data.draw(st.integers(1, rungs))
    states = _states(data, n, rungs, brackets)
    mode = data.draw(st.sampled_from(["min", "max"]))
    got = decide(states, eta=eta, rungs=rungs, mode=mode, all_created=all_created, free_slots=n, brackets=brackets)
    alone = Decision()
    for b in range(brackets):
        d = decide([t for t in states if bracket_of(t.number, brackets) == b], eta=eta, rungs=rungs, mode=mode,
                   all_created=all_created, free_slots=n)
        alone.promote.extend(d.promote)
        alone.stop.extend(d.stop)
    assert sorted(got.promote) == sorted(alone.promote) and sorted(got.stop) == sorted(alone.stop)
    for t, rung in got.promote:
        assert rung >= bracket_of(t, brackets)
    # Scarce slots go to the highest rung first, whatever the bracket.
    few = decide(states, eta=eta, rungs=rungs, mode=mode, all_created=all_created, free_slots=1, brackets=brackets)
    if got.promote:
        assert len(few.promote) == 1 and few.promote[0][1] == max(r for _, r in got.promote)


def test_a_later_bracket_starts_at_a_later_rung_and_is_ranked_alone() -> None:
    # Two brackets over three rungs: even trials start at rung 0, odd ones at rung 1. Nine of each paused at their
    # first rung, the odd ones all worse than the even ones: the best three of each bracket still go on.
    states = [TrialState(i, {i % 2: float(i)}, i % 2, paused=True, ended=False) for i in range(18)]
    d = decide(states, eta=3, rungs=3, mode="min", all_created=True, free_slots=18, brackets=2)
    assert sorted(d.promote) == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0), (5, 1)]
    assert sorted(d.stop) == list(range(6, 18))


def test_brackets_are_at_most_the_rungs() -> None:
    assert sweep(method="asha", max_trials=9, asha={"min_resource": 10, "rungs": 3, "brackets": 3}).asha is not None
    with pytest.raises(ValidationError, match="at most asha.rungs"):
        sweep(method="asha", max_trials=9, asha={"min_resource": 10, "rungs": 3, "brackets": 4})
    with pytest.raises(ValidationError, match="brackets"):
        sweep(method="asha", max_trials=9, asha={"min_resource": 10, "rungs": 3, "brackets": 0})


def test_asha_of_nine_stops_six_at_the_first_rung_and_promotes_the_best() -> None:
    # Nine trials all paused at rung 0: the best three go on; the other six are stopped.
    states = [TrialState(i, {0: float(i)}, 0, paused=True, ended=False) for i in range(9)]
    d = decide(states, eta=3, rungs=3, mode="min", all_created=True, free_slots=9)
    assert sorted(t for t, _ in d.promote) == [0, 1, 2]
    assert sorted(d.stop) == [3, 4, 5, 6, 7, 8]
    # Maximising picks the other end.
    d = decide(states, eta=3, rungs=3, mode="max", all_created=True, free_slots=1)
    assert d.promote == [(8, 0)] and sorted(d.stop) == [0, 1, 2, 3, 4, 5]


def test_asha_does_not_wait_for_stragglers() -> None:
    # Three of nine reached rung 0; the best of them goes on at once, nobody is stopped yet.
    states = [TrialState(i, {0: float(i)}, 0, paused=True, ended=False) for i in range(3)]
    d = decide(states, eta=3, rungs=3, mode="min", all_created=False, free_slots=2)
    assert d.promote == [(0, 0)] and d.stop == []


@given(st.lists(st.tuples(st.integers(1, 300), st.floats(0, 10, allow_nan=False)), min_size=1, max_size=40,
                unique_by=lambda p: p[0]))
def test_a_rung_reads_the_last_value_at_or_before_it_once_a_point_reached_it(points: list[tuple[int, float]]) -> None:
    from jobs.sweeps.controller import rung_values

    s = sweep(method="asha", max_trials=9, asha={"min_resource": 10, "reduction_factor": 3, "rungs": 4})
    pts = sorted((step, 0, value) for step, value in points)
    got = rung_values(pts, s)
    last = pts[-1][0]
    # Rungs are reached in order, and only those a point reached.
    assert sorted(got) == [k for k in range(4) if s.asha is not None and s.asha.resource_at(k) <= last]
    for k, value in got.items():
        need = 10 * 3 ** k
        before = [v for step, _, v in pts if step <= need]
        assert value == (before[-1] if before else next(v for step, _, v in pts if step >= need))
