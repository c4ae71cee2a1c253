"""The local stack's admin token: TORCHYARD_ADMIN_TOKEN when set, else one made once and kept in var/admin-token."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stack import __main__ as stack_main


@pytest.fixture()
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "var").mkdir()
    return tmp_path / "var" / "admin-token"


def test_the_token_is_made_once_and_kept_0600(in_tmp: Path) -> None:
    token = stack_main.admin_token(None)
    assert len(token) >= 32 and in_tmp.read_text().strip() == token
    assert stat.S_IMODE(in_tmp.stat().st_mode) == 0o600
    assert stack_main.admin_token(None) == token


def test_a_wider_file_is_narrowed_and_its_token_kept(in_tmp: Path) -> None:
    in_tmp.write_text("my-own-token\n")
    in_tmp.chmod(0o644)
    assert stack_main.admin_token(None) == "my-own-token"
    assert stat.S_IMODE(in_tmp.stat().st_mode) == 0o600


def test_a_configured_token_wins_and_leaves_no_file(in_tmp: Path) -> None:
    assert stack_main.admin_token("from-the-environment") == "from-the-environment"
    assert not in_tmp.exists()
