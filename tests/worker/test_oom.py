"""Which specs OOM recovery can adjust, and how (the retry itself is in tests/chaos/test_oom_recovery.py)."""

from __future__ import annotations

from worker.oom import halved_micro_batch


def _spec(auto: bool = True, batch: int = 32, accum: int = 1) -> dict:
    return {"name": "j", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
            "train": {"global_batch_size": batch, "grad_accum_steps": accum, "auto_micro_batch": auto}}


def test_halving_keeps_the_global_batch_and_stops_at_an_odd_micro_batch() -> None:
    spec, changes = _spec(batch=24), []
    while (halved := halved_micro_batch(spec, len(changes) + 1, ranks=2)) is not None:
        spec, change = halved
        changes.append(change)
    assert [(c["from"], c["to"], c["micro_batch"]["to"]) for c in changes] == [(1, 2, 6), (2, 4, 3)]
    assert spec["train"]["global_batch_size"] == 24 and changes[-1]["attempt"] == 3


def test_nothing_changes_without_the_option_or_for_scripts() -> None:
    assert halved_micro_batch(_spec(auto=False), 1, ranks=1) is None
    assert halved_micro_batch({**_spec(), "kind": "script"}, 1, ranks=1) is None
    original = _spec()
    halved_micro_batch(original, 1, ranks=1)
    assert original["train"]["grad_accum_steps"] == 1  # the stored spec is not modified in place
