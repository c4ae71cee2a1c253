"""jobs.reads.artifacts.open_under: the one way the API opens a file of a run directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.reads.artifacts import open_under


def test_reads_a_regular_file_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "logs" / "r0").mkdir(parents=True)
    (tmp_path / "logs" / "r0" / "stdout.log").write_text("hello\n")
    with open_under(tmp_path, "logs/r0/stdout.log") as f:
        assert f.read() == b"hello\n"


@pytest.mark.parametrize("relative", ["", "/etc/hostname", "../secret", "logs/../../secret", "logs/./x", "a\x00b"])
def test_refuses_paths_that_leave_or_are_malformed(tmp_path: Path, relative: str) -> None:
    (tmp_path.parent / "secret").write_text("s")
    with pytest.raises(FileNotFoundError):
        open_under(tmp_path, relative)


def test_refuses_symlinks_at_any_depth_and_non_regular_files(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (outside / "d").mkdir(parents=True)
    (outside / "d" / "f").write_text("outside")
    (tmp_path / "logs").mkdir()
    (tmp_path / "link-file").symlink_to(outside / "d" / "f")
    (tmp_path / "link-dir").symlink_to(outside / "d")
    (tmp_path / "logs" / "inner").symlink_to(tmp_path / "logs")  # even a link that stays inside is refused
    os.mkfifo(tmp_path / "fifo")
    for relative in ("link-file", "link-dir/f", "logs/inner", "fifo", "logs"):
        with pytest.raises(FileNotFoundError):
            open_under(tmp_path, relative)
