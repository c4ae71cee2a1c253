"""The compose interpolation the deploy tests rely on follows Compose's rules."""

from __future__ import annotations

import pytest

from tests.deploy.composefile import InterpolationError, duration_seconds, interpolate, referenced_variables

ENV = {"SET": "value", "EMPTY": ""}


@pytest.mark.parametrize(("text", "expected"), [
    ("plain", "plain"),
    ("$SET/${SET}", "value/value"),
    ("${UNSET}", ""),
    ("${UNSET:-fallback}", "fallback"),
    ("${EMPTY:-fallback}", "fallback"),
    ("${EMPTY-fallback}", ""),
    ("${UNSET-fallback}", "fallback"),
    ("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}|${UNSET+alt}", "alt||alt|"),
    ("${UNSET:-${SET}-x}", "value-x"),
    ("${UNSET:-${ALSO_UNSET:-deep}}", "deep"),
    ("$$SET costs $$5", "$SET costs $5"),
    ("${SET:?must be set}", "value"),
])
def test_interpolate(text: str, expected: str) -> None:
    assert interpolate(text, ENV) == expected


@pytest.mark.parametrize("text", ["${EMPTY:?set EMPTY}", "${UNSET?set UNSET}"])
def test_required_variables_raise_with_their_message(text: str) -> None:
    with pytest.raises(InterpolationError, match="set "):
        interpolate(text, ENV)


@pytest.mark.parametrize("text", ["${", "${1BAD}", "${SET!x}", "$!"])
def test_invalid_syntax_raises(text: str) -> None:
    with pytest.raises(InterpolationError):
        interpolate(text, ENV)


def test_referenced_variables_skip_escapes() -> None:
    assert referenced_variables("$A ${B:-${C}} $$D") == {"A", "B", "C"}


def test_duration_seconds() -> None:
    assert duration_seconds("1m30s") == 90
    assert duration_seconds("150s") == 150
    with pytest.raises(ValueError):
        duration_seconds("2 minutes")
