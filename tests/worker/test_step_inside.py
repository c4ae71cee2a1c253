"""checkpoint.discover globs matched where the script runs, and the step read from inside a file whose name names
none (nanoGPT's out/ckpt.pt): safely, bounded in size and time, off the supervisor's tick."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from jobspec.spec import spec_from_dict
from worker import step_inside
from worker.checkpoints_found import discover
from worker.found import Found, not_applied, resume_arguments
from worker.step_inside import PENDING, STEP_KEYS, StepReader, read_step, step_in


def _aged(path: Path, seconds: float = 5) -> Path:
    when = time.time() - seconds
    os.utime(path, (when, when))
    return path


@given(st.dictionaries(st.sampled_from([*STEP_KEYS, "model", "lr"]), st.one_of(st.integers(-5, 10**9), st.booleans(),
                                                                              st.floats(), st.text(max_size=3))))
def test_the_step_is_the_first_key_holding_a_non_negative_int(data: dict) -> None:
    expected = next((data[k] for k in STEP_KEYS if type(data.get(k)) is int and data[k] >= 0), None)
    assert step_in(data) == expected
    assert step_in([data]) is None and step_in(None) is None


def test_lightning_global_step_wins_over_its_epoch() -> None:
    assert step_in({"epoch": 3, "global_step": 400}) == 400
    assert step_in({"iter_num": 250, "best_val_loss": 1.5, "model": {}}) == 250


def test_a_nanogpt_checkpoint_names_its_iter_num(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.zeros(3)}, "iter_num": 250, "config": {"n_layer": 2}}, tmp_path / "ckpt.pt")
    assert read_step(tmp_path, tmp_path / "ckpt.pt") == 250
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")  # not a mapping: no step
    assert read_step(tmp_path, tmp_path / "tensor.pt") is None


def test_a_hostile_file_runs_nothing_and_a_large_or_slow_one_is_not_read(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # noqa: ANN204 - what a hostile pickle does when loaded without weights_only
            return (os.system, (f"touch {marker}",))

    torch.save({"iter_num": 5, "x": Evil()}, tmp_path / "evil.pt")
    assert read_step(tmp_path, tmp_path / "evil.pt") == 5 and not marker.exists()  # its step, and nothing of it ran
    with (tmp_path / "plain.pkl").open("wb") as f:
        pickle.dump({"iter_num": 5, "x": Evil()}, f)
    assert read_step(tmp_path, tmp_path / "plain.pkl") is None and not marker.exists()  # not torch's zip format: not unpickled
    torch.save({"step": 9}, tmp_path / "big.pt")
    assert read_step(tmp_path, tmp_path / "big.pt", max_bytes=10) is None  # over the cap: never opened
    assert read_step(tmp_path, tmp_path / "big.pt", timeout_s=0.001) is None  # the child is killed at the deadline


def test_a_tick_is_not_held_up_by_the_read(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"iter_num": 7}, path)
    reader = StepReader()
    assert reader.step(tmp_path, path) is PENDING  # the child process is still starting: the tick goes on
    assert reader.step(tmp_path, path, wait=True) == 7
    assert reader.step(tmp_path, path) == 7  # cached for this version of the file
    torch.save({"iter_num": 8}, path)
    _aged(path, -2)  # a new mtime: read again
    assert reader.step(tmp_path, path, wait=True) == 8


def test_globs_are_matched_in_the_working_directory_and_the_step_read_from_inside(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    work = tmp_path / "workdir"
    (work / "out").mkdir(parents=True)
    torch.save({"model": {}, "iter_num": 250}, work / "out" / "ckpt.pt")
    _aged(work / "out" / "ckpt.pt")
    found = discover(tmp_path, ["out/*.pt"], time.time(), glob_root=work)
    assert [(c.path, c.kind, c.step) for c in found] == [(work / "out" / "ckpt.pt", "glob", 250)]
    assert discover(tmp_path, ["out/*.pt"], time.time()) == []  # not relative to the run directory around it
    # A tick does not wait for the reader: the checkpoint is listed once its step is known.
    monkeypatch.setattr(step_inside, "READER", StepReader())
    ticked = discover(tmp_path, ["out/*.pt"], time.time(), glob_root=work, wait=False)
    assert ticked in ([], found)


def test_a_resume_names_the_checkpoint_in_the_working_directory_or_says_why_not(tmp_path: Path) -> None:
    spec = spec_from_dict({"kind": "script", "name": "nano", "entrypoint": "train.py", "resume_args": ["--init_from=resume"],
                           "checkpoint": {"discover": ["out/*.pt"]}})
    work = tmp_path / "workdir"
    found = Found(tmp_path, ["out/*.pt"], glob_root=lambda: work)
    nothing = resume_arguments(spec, found, resumes=True, inherited=None)
    assert nothing.spec.args == [] and nothing.note == "resume_args not applied: no checkpoint found under out/*.pt"
    assert not_applied(["out/*.pt", "ckpt/*"]) == "resume_args not applied: no checkpoint found under out/*.pt, ckpt/*"
    (work / "out").mkdir(parents=True)
    torch.save({"iter_num": 40}, work / "out" / "ckpt.pt")
    _aged(work / "out" / "ckpt.pt")
    resumed = resume_arguments(spec, found, resumes=True, inherited=None)
    assert resumed.spec.args == ["--init_from=resume"] and resumed.step == 40 and resumed.note is None
