"""Asynchronous successive halving (ASHA; Li et al., "A System for Massively Parallel Hyperparameter Tuning",
MLSys 2020), as one pure function of the trials' state.

Rung k is the resource ``min_resource * eta**k``. A trial runs until the rung it is allowed to reach, records
its metric there and pauses. A paused trial at rung k is promoted (allowed rung k+1) when it is among the best
``floor(n_k / eta)`` of the ``n_k`` trials that reached rung k and fewer than that many were promoted from
rung k already: no rung waits for stragglers. Once every trial of the sweep has been created and has reached
rung k or ended, rung k is final: its best ``max(1, floor(n_k / eta))`` go on (so a sweep always trains at
least one trial to the last rung) and the other paused trials there are stopped early.

With ``brackets`` > 1 this is asynchronous Hyperband (the same paper, section 3): bracket ``s`` is an ASHA of its
own whose first rung is rung ``s``, so later brackets stop fewer trials, later, and a slow starter that the early
rungs would rank last can still reach the end. A trial is ranked only against the trials of its own bracket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from jobs.sweeps.spec import AshaSpec, rank_key


@dataclass(frozen=True)
class TrialState:
    number: int
    rung_values: dict[int, float]  # rung -> the metric the trial had there
    allowed: int  # the highest rung it may train to
    paused: bool  # waiting at rung ``allowed`` for a decision
    ended: bool  # finished, failed, cancelled or stopped: will reach no further rung


@dataclass(frozen=True)
class Decision:
    promote: list[tuple[int, int]] = field(default_factory=list)  # (trial, from rung): it may now reach rung+1
    stop: list[int] = field(default_factory=list)  # paused trials that go no further


def bracket_of(number: int, brackets: int) -> int:
    """The bracket of trial ``number``, which is also the first rung it pauses at.

    Round robin on the trial number, as the paper loops over brackets, rather than Ray Tune's random draw weighted
    toward the first bracket: a pure function of the number, so a controller that restarts recomputes it without
    storing it, and every bracket gets its share of trials (the later brackets, the ones that protect slow
    starters, are the reason to have brackets at all)."""
    return number % brackets


def quota(reached: int, eta: int, final: bool) -> int:
    """How many of the ``reached`` trials at a rung may go on."""
    share = reached // eta
    return max(1, share) if final and reached > 0 else share


def decide(trials: Sequence[TrialState], *, eta: int, rungs: int, mode: str, all_created: bool,
           free_slots: int, brackets: int = 1) -> Decision:
    """Promotions (at most ``free_slots`` of them, the highest rung first as in the paper: those trials are closest
    to done) and early stops, for the trials as they stand. A trial's bracket is ``bracket_of(number, brackets)``;
    its values at rungs below its bracket's first are not looked at."""
    decision = Decision()
    slots = free_slots
    members: dict[int, list[TrialState]] = {}
    for t in trials:
        members.setdefault(bracket_of(t.number, brackets), []).append(t)
    for rung in range(rungs - 2, -1, -1):  # the last rung promotes nowhere
        for bracket in sorted(members):
            if bracket <= rung:
                slots = _rung(members[bracket], rung, decision, slots, eta=eta, mode=mode, all_created=all_created)
    return decision


def _rung(trials: list[TrialState], rung: int, decision: Decision, slots: int, *, eta: int, mode: str,
          all_created: bool) -> int:
    """Rung ``rung`` of one bracket: adds its promotions and stops to ``decision``; returns the slots left."""
    reached = [t for t in trials if rung in t.rung_values]
    if not reached:
        return slots
    # Final: no trial of the bracket can still arrive at this rung.
    final = all_created and all(rung in t.rung_values or t.ended for t in trials)
    share = quota(len(reached), eta, final)
    room = share - sum(1 for t in reached if t.allowed > rung)
    # Once final, a trial that ended at this rung without going on takes no place among the best.
    pool = [t for t in reached if not (final and t.ended and t.allowed <= rung)]
    top = sorted(pool, key=lambda t: (rank_key(mode, t.rung_values[rung]), t.number))[:share]
    placed: set[int] = set()  # promoted now, or once a slot frees: either way the place is theirs
    for trial in top:
        if len(placed) >= room:
            break
        if trial.paused and trial.allowed == rung and not trial.ended:
            placed.add(trial.number)
            if slots > 0:
                decision.promote.append((trial.number, rung))
                slots -= 1
    if final:
        decision.stop.extend(t.number for t in reached
                             if t.paused and t.allowed == rung and not t.ended and t.number not in placed)
    return slots


def pause_at(spec: AshaSpec, allowed: int) -> int | None:
    """Where a trial allowed up to rung ``allowed`` stops by itself: that rung's resource (steps or epochs), so it
    trains not one step past what ASHA ranks it on. None at the last rung: it trains to the end (``max_resource``,
    also the horizon of its learning-rate schedule from the first step)."""
    if allowed >= spec.rungs - 1:
        return None
    return spec.resource_at(max(0, allowed))
