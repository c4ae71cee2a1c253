"""A script job's working directory: a writable copy of its code, made once and kept across attempts, where its
ranks start; what the job planted where the worker writes is never followed. No torchrun here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jobs.reads.workdir_files import list_written
from jobs.settings import Settings
from jobspec.spec import ScriptJobSpec
from worker import workdir
from worker.launch import start_dir, torchrun_command, torchrun_env
from worker.venvs import SetupFailed

DIGEST = "sha256:" + "0" * 64


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(runs_dir=tmp_path / "runs", code_dir=tmp_path / "code", database_url="sqlite://",
                    redis_url="redis://127.0.0.1:1")


def files(root: Path, tree: dict[str, str], mode: int = 0o644) -> None:
    for rel, text in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        os.chmod(root / rel, mode)


def bundle_run(settings: Settings, name: str = "job-1") -> Path:
    """A run directory whose read-only code/ is unpacked as the worker unpacks a bundle (0555/0444)."""
    run_dir = settings.runs_dir / name
    files(run_dir / "code", {"train.py": "print(1)\n", "config/base.yaml": "lr: 1\n"}, 0o444)
    for d in (run_dir / "code" / "config", run_dir / "code"):
        os.chmod(d, 0o555)
    return run_dir


def test_a_bundle_job_runs_in_a_writable_copy_made_once(settings: Settings) -> None:
    run_dir = bundle_run(settings)
    spec = ScriptJobSpec(kind="script", name="s", entrypoint="train.py", code=DIGEST)
    copy = workdir.make(settings, spec, run_dir)
    assert copy == run_dir / "workdir" and (copy / "config" / "base.yaml").read_text() == "lr: 1\n"
    (copy / "config" / "base.yaml").write_text("lr: 2\n")  # the job may change its own files
    (copy / "written.txt").write_text("mine")
    assert stat.S_IMODE((run_dir / "code" / "train.py").stat().st_mode) == 0o444  # the uploaded copy stays as it was
    again = workdir.make(settings, spec, run_dir)  # the next attempt: the same copy, the job's files in it
    assert (again / "written.txt").read_text() == "mine" and (again / "config" / "base.yaml").read_text() == "lr: 2\n"
    assert [p for p, _, _ in list_written(run_dir, 100)] == ["workdir/config/base.yaml", "workdir/written.txt"]

    assert start_dir(spec, run_dir, settings) == copy
    command = torchrun_command(spec, run_dir, 1, settings)
    assert str(copy.resolve()) in command and str((copy / "train.py").resolve()) in command
    assert torchrun_env("job-1", 1, run_dir, settings, spec)["TORCHYARD_CODE_DIR"] == str(copy.resolve())


def test_a_code_root_job_copies_its_entry_and_starts_in_it(settings: Settings) -> None:
    files(settings.code_dir, {"nanogpt/train.py": "", "nanogpt/config/c.py": "", "other/big.bin": "x" * 100})
    run_dir = settings.runs_dir / "job-2"
    run_dir.mkdir(parents=True)
    absolute = ScriptJobSpec(kind="script", name="s", entrypoint=str(settings.code_dir / "nanogpt" / "train.py"))
    copy = workdir.make(settings, absolute, run_dir)
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*")) == [
        "nanogpt", "nanogpt/config", "nanogpt/config/c.py", "nanogpt/train.py"]
    assert start_dir(absolute, run_dir, settings) == copy / "nanogpt"
    assert str((copy / "nanogpt" / "train.py").resolve()) in torchrun_command(absolute, run_dir, 1, settings)
    assert list_written(run_dir, 100) == []


def test_a_top_level_script_copies_the_code_root_within_the_size_cap(settings: Settings) -> None:
    files(settings.code_dir, {"train.py": "", "helpers.py": "", "data/x.csv": "1,2\n"})
    spec = ScriptJobSpec(kind="script", name="s", entrypoint="train.py")
    run_dir = settings.runs_dir / "job-3"
    run_dir.mkdir(parents=True)
    assert {p.name for p in workdir.make(settings, spec, run_dir).iterdir()} == {"train.py", "helpers.py", "data"}
    assert start_dir(spec, run_dir, settings) == run_dir / "workdir"

    small = settings.model_copy(update={"max_code_unpacked_bytes": 3})
    other = settings.runs_dir / "job-4"
    other.mkdir()
    with pytest.raises(SetupFailed, match="TORCHYARD_MAX_CODE_UNPACKED_BYTES"):
        workdir.make(small, spec, other)
    assert not (other / "workdir").exists()


def test_links_the_job_planted_where_the_worker_writes_are_replaced_not_followed(settings: Settings, tmp_path: Path) -> None:
    run_dir = bundle_run(settings)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.json").write_text("keep")
    os.symlink(outside / "victim.json", run_dir / "workdir.json")
    os.symlink(outside, run_dir / "workdir")
    spec = ScriptJobSpec(kind="script", name="s", entrypoint="train.py", code=DIGEST)
    copy = workdir.make(settings, spec, run_dir)
    assert not copy.is_symlink() and (copy / "train.py").is_file()
    assert not (run_dir / "workdir.json").is_symlink()
    assert (outside / "victim.json").read_text() == "keep" and sorted(os.listdir(outside)) == ["victim.json"]


def test_event_files_uploaded_with_the_code_are_not_the_jobs_metrics(settings: Settings) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from worker.tb_tail import TensorBoardTail

    run_dir = bundle_run(settings)
    os.chmod(run_dir / "code", 0o755)
    with SummaryWriter(str(run_dir / "code" / "runs" / "old")) as old:  # a run on the laptop, uploaded along
        old.add_scalar("loss", 9.0, 1)
    copy = workdir.make(settings, ScriptJobSpec(kind="script", name="s", entrypoint="train.py", code=DIGEST), run_dir)
    tail = TensorBoardTail(run_dir)
    assert tail.read(force_scan=True) == []
    with SummaryWriter(str(copy / "runs" / "new")) as new:
        new.add_scalar("loss", 0.5, 3)
    assert [(p.name, p.step, p.value) for p in tail.read(force_scan=True)] == [("loss", 3, 0.5)]
