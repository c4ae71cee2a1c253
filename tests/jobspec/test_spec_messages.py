"""Validation errors in the user's words: one message per field, no pydantic internals, a suggestion for typos."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobspec.messages import field_names, suggestion, user_problems
from jobspec.spec import JobSpec, ScriptJobSpec, spec_from_dict
from tests.quick_examples import examples

BASE: dict[str, Any] = {"name": "x", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
                        "parallel": {"nproc_per_node": 2}, "train": {"epochs": 1, "global_batch_size": 32}}
SECTIONS = {"": JobSpec, "parallel": JobSpec.model_fields["parallel"].annotation, "train": JobSpec.model_fields["train"].annotation}
INTERNALS = ("Input should", "Extra inputs", "constrained-", "literal[", "function-", "Field required")
values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=8), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _problems(raw: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    try:
        spec_from_dict(raw)
    except ValidationError as exc:
        return user_problems(exc.errors(), [JobSpec, ScriptJobSpec])
    return []


@settings(max_examples=examples(150), deadline=None)
@given(section=st.sampled_from(sorted(SECTIONS)), data=st.data(), value=values)
def test_any_bad_value_or_key_gets_one_message_per_field_without_pydantic_internals(section: str, data: st.DataObject,
                                                                                     value: Any) -> None:
    known = st.sampled_from(field_names(SECTIONS[section]))
    key = data.draw(st.one_of(known, st.text(string.ascii_lowercase + "_", min_size=1, max_size=20)))
    raw = {**BASE, section: {**BASE[section], key: value}} if section else {**BASE, key: value}
    problems = _problems(raw)
    fields = [".".join(map(str, loc)) for loc, _ in problems]
    assert len(fields) == len(set(fields))  # union branches merged into one message
    for loc, message in problems:
        assert message and not any(word in message for word in INTERNALS), (raw, loc, message)
        assert _written(raw, loc), (raw, loc)  # a path the user wrote, never a union branch's label


def _written(raw: Any, loc: tuple[Any, ...]) -> bool:
    """``loc`` is a path through what the user sent (its last key may be missing: a required field)."""
    node = raw
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return i == len(loc) - 1 and isinstance(node, (dict, list))
    return True


@settings(max_examples=examples(150), deadline=None)
@given(section=st.sampled_from(sorted(SECTIONS)), data=st.data())
def test_a_misspelt_field_name_is_suggested_back(section: str, data: st.DataObject) -> None:
    names = field_names(SECTIONS[section])
    name = data.draw(st.sampled_from([n for n in names if len(n) >= 5]))
    i = data.draw(st.integers(0, len(name) - 1))
    typo = name[:i] + name[i + 1:]  # one letter dropped
    if typo in names:
        return
    raw = {**BASE, section: {**BASE[section], typo: BASE.get(name, 1)}} if section else {**BASE, typo: 1}
    [(loc, message)] = [p for p in _problems(raw) if p[0][-1] == typo]
    said = message.removeprefix('unknown field; did you mean "').removesuffix('"?')
    assert said in names and suggestion(typo, names) == said


def test_suggestions_read_abbreviations_and_containment_and_decline_far_words() -> None:
    train = field_names(SECTIONS["train"])
    assert suggestion("learning_rate", train) == "lr"
    assert suggestion("batch_size", train) == "global_batch_size"
    assert suggestion("zzz", train) is None


def test_a_field_typed_wrong_says_what_it_accepts() -> None:
    [(loc, message)] = _problems({**BASE, "parallel": {"nproc_per_node": "two"}})
    assert (loc, message) == (("parallel", "nproc_per_node"), 'must be an integer from 1 to 64 or "gpu"; got "two"')
    [(loc, message)] = _problems({**BASE, "train": {"epochs": 1, "global_batch_size": 32, "lr": "fast"}})
    assert message == 'must be a number greater than 0.0 and at most 10.0; got "fast"'


def test_a_spec_that_is_not_a_mapping_is_said_so_without_naming_a_kind() -> None:
    try:
        spec_from_dict([1, 2])  # type: ignore[arg-type]
    except ValidationError as exc:
        assert user_problems(exc.errors(), [JobSpec, ScriptJobSpec]) == [((), "must be a mapping of fields; got [1, 2]")]
    else:
        raise AssertionError("a list was accepted as a spec")
