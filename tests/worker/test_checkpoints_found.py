"""Checkpoints the frameworks write, found as they lay them out; resume arguments rendered from templates."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from jobspec.resume_args import render, template_problem
from jobspec.spec import SpecLimits, parse_spec, spec_from_dict
from worker.checkpoints_found import discover, latest, step_from_name, whole_zip
from worker.found import Found, resume_arguments
from worker.step_inside import read_step


def _age(path: Path, seconds: float) -> None:
    """Make ``path`` (and everything in it) look written ``seconds`` ago."""
    when = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (when, when))


def _layouts(root: Path) -> None:
    logs = root / "lightning_logs" / "version_0" / "checkpoints"
    logs.mkdir(parents=True)
    torch.save({"global_step": 40, "state_dict": {}}, logs / "epoch=1-step=40.ckpt")
    torch.save({"global_step": 40, "state_dict": {}}, logs / "last.ckpt")
    hf = root / "out" / "checkpoint-30"
    hf.mkdir(parents=True)
    (hf / "model.safetensors").write_bytes(b"x")
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
    half = root / "out" / "checkpoint-60"  # the Trainer is still writing it: no trainer_state.json yet
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"x")
    acc = root / "ckpts" / "checkpoint_2"
    acc.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl"):
        (acc / name).write_bytes(b"x")
    (root / "weights").mkdir()
    (root / "weights" / "model_000500.pt").write_bytes(b"x")


def test_framework_layouts_are_found_complete_with_their_steps(tmp_path: Path) -> None:
    _layouts(tmp_path)
    for p in tmp_path.rglob("*"):
        _age(p, 5)
    found = discover(tmp_path, ["weights/*.pt"], time.time())
    by_path = {str(c.path.relative_to(tmp_path)): (c.kind, c.step) for c in found}
    assert by_path == {
        "lightning_logs/version_0/checkpoints/epoch=1-step=40.ckpt": ("lightning", 40),
        "lightning_logs/version_0/checkpoints/last.ckpt": ("lightning", 40),  # read from the file's global_step
        "out/checkpoint-30": ("huggingface", 30),
        "ckpts/checkpoint_2": ("accelerate", 2),
        "weights/model_000500.pt": ("glob", 500),
    }
    # A file still being written (modified within the last second) is not complete yet.
    torch.save({"global_step": 50}, tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "epoch=2-step=50.ckpt")
    assert len(discover(tmp_path, [], time.time())) == 4
    # Files older than the job (an uploaded pretrained checkpoint) are not its own.
    assert discover(tmp_path, ["weights/*.pt"], time.time(), since=time.time() - 1) == []


def test_resume_arguments_name_the_latest_complete_checkpoint_only_when_resuming(tmp_path: Path) -> None:
    spec = spec_from_dict({"kind": "script", "name": "l", "entrypoint": "train.py", "args": ["--epochs", "3"],
                       "resume_args": ["--ckpt_path", "{checkpoint}", "--tag={{x}}"]})
    found = Found(tmp_path)
    nothing = resume_arguments(spec, found, resumes=True, inherited=None)  # nothing to resume from yet
    assert (nothing.spec, nothing.step) == (spec, None)
    assert nothing.note == ("resume_args not applied: no checkpoint found under the Lightning, Hugging Face and "
                            "Accelerate layouts (name your own with checkpoint.discover)")
    _layouts(tmp_path)
    for p in tmp_path.rglob("*"):
        _age(p, 10)
    newest = tmp_path / "out" / "checkpoint-30"
    _age(newest, 3)
    first = resume_arguments(spec, found, resumes=False, inherited=None)
    assert first.spec.args == ["--epochs", "3"] and first.step is None and first.note is None
    resumed = resume_arguments(spec, found, resumes=True, inherited=None)
    assert resumed.spec.args == ["--epochs", "3", "--ckpt_path", str(newest.resolve()), "--tag={x}"]
    assert resumed.step == 30 and resumed.note is None
    assert latest(found.checkpoints()) is not None


@pytest.mark.parametrize(("arg", "words"), [
    ("{ckpt}", "{ckpt} is not a placeholder"), ("{checkpoint", "not a valid template"), ("{checkpoint:>9}", "not a placeholder"),
])
def test_a_malformed_template_is_refused_naming_the_field(arg: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_spec({"kind": "script", "name": "l", "entrypoint": "t.py", "resume_args": ["--x", arg]}, SpecLimits())
    problems = [(p.loc, p.msg) for p in caught.value.problems]  # type: ignore[attr-defined]
    assert any(loc == ("resume_args", 1) and words in msg for loc, msg in problems), problems


_TEXT = st.text(st.characters(blacklist_characters="{}\x00"), max_size=20)


@given(before=_TEXT, after=_TEXT, where=st.text(max_size=40))
def test_rendering_replaces_exactly_the_placeholder(before: str, after: str, where: str) -> None:
    template = f"{before}{{checkpoint}}{after}"
    assert template_problem(template) is None
    assert render([template, before], where) == [before + where + after, before]


@given(st.text(max_size=30))
def test_every_template_is_either_refused_or_renders(arg: str) -> None:
    if template_problem(arg) is None:
        rendered = render([arg], "/ckpt")[0]
        assert "{checkpoint}" not in rendered


@given(prefix=st.from_regex(r"(epoch=[0-9]{1,3}[-_])?", fullmatch=True), step=st.integers(0, 10**9),
       suffix=st.sampled_from(["", "-v1", "_last"]))
def test_the_step_in_a_lightning_name_is_read(prefix: str, step: int, suffix: str) -> None:
    assert step_from_name(f"{prefix}step={step}{suffix}.ckpt", "lightning") == step
    assert step_from_name(f"{prefix}{suffix}.ckpt", "lightning") is None  # no step in the name: read from the file


def test_download_path_picks_the_one_checkpoint_ending_with_it() -> None:
    import typer

    from torchyard.cli.files import _checkpoint_step
    from torchyard.client.models import Checkpoint

    listed = [Checkpoint(step=40, path="/runs/j/lightning_logs/version_0/checkpoints/epoch=1-step=40.ckpt"),
              Checkpoint(step=41, path="/runs/j/lightning_logs/version_0/checkpoints/last.ckpt"),
              Checkpoint(step=30, path="/runs/j/out/checkpoint-30")]
    assert _checkpoint_step(listed, "j", "last.ckpt") == 41
    assert _checkpoint_step(listed, "j", "out/checkpoint-30/") == 30
    with pytest.raises(typer.BadParameter, match="0 checkpoints of job j end with 'ast.ckpt'"):
        _checkpoint_step(listed, "j", "ast.ckpt")


def test_a_checkpoint_shipped_in_the_upload_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    torch.save({"global_step": 7}, tmp_path / "code" / "pretrained.ckpt")
    torch.save({"global_step": 9}, tmp_path / "mine.ckpt")
    for p in tmp_path.rglob("*"):
        _age(p, 5)
    assert [c.path.name for c in discover(tmp_path, [], time.time())] == ["mine.ckpt"]


def test_a_checkpoint_cut_off_mid_write_is_never_complete(tmp_path: Path) -> None:
    whole = tmp_path / "epoch=0-step=4.ckpt"
    torch.save({"global_step": 4, "w": torch.zeros(1000)}, whole)
    cut = tmp_path / "epoch=0-step=8.ckpt"
    cut.write_bytes(whole.read_bytes()[:-200])  # the rank was SIGKILLed while torch.save wrote it
    for p in (whole, cut):
        _age(p, 60)
    assert [c.step for c in discover(tmp_path, [], time.time())] == [4]


def test_a_fifo_where_a_checkpoint_file_belongs_neither_hangs_the_scan_nor_is_listed(tmp_path: Path) -> None:
    trap = tmp_path / "out" / "checkpoint-5"
    trap.mkdir(parents=True)
    os.mkfifo(trap / "trainer_state.json")  # a plain open of it would wait for a writer that never comes
    torch.save({"global_step": 9}, tmp_path / "mine.ckpt")
    for p in tmp_path.rglob("*"):
        _age(p, 5)
    found: list = []
    scan = threading.Thread(target=lambda: found.extend(discover(tmp_path, [], time.time())), daemon=True)
    scan.start()
    scan.join(timeout=120)  # far past a healthy scan (milliseconds)
    assert not scan.is_alive(), "the checkpoint scan blocked on the FIFO"
    assert [c.path.name for c in found] == ["mine.ckpt"]


def test_a_checkpoint_swapped_for_a_link_to_another_jobs_is_not_read(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    (mine / "out").mkdir(parents=True)
    other.mkdir()
    torch.save({"iter_num": 4321}, other / "ckpt.pt")  # another job's checkpoint, readable by the worker
    (mine / "out" / "ckpt.pt").symlink_to(other / "ckpt.pt")  # in place of the file the scan found
    assert read_step(mine, mine / "out" / "ckpt.pt") is None
    assert not whole_zip(mine, mine / "out" / "ckpt.pt")
    assert read_step(other, other / "ckpt.pt") == 4321 and whole_zip(other, other / "ckpt.pt")
