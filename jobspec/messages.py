"""Pydantic's validation errors in the words of the person who wrote the spec.

Pydantic reports one error per union branch under a location naming the branch
(``parallel.nproc_per_node.constrained-int`` and ``parallel.nproc_per_node.literal['gpu']``) and an
unknown key as "Extra inputs are not permitted". Here each field gets one message: what the field
accepts, read from its annotation ("must be an integer from 1 to 64 or \"gpu\"; got \"two\""), and an
unknown key the closest field name of its section ("unknown field; did you mean \"lr\"?").
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr

# Error types whose message is better said as "must be <what the field accepts>".
_TYPE_ERRORS = ("_type", "_parsing", "literal_error", "int_from_float", "greater_than", "less_than", "multiple_of",
                "finite_number", "too_short", "too_long", "string_pattern_mismatch", "enum")


_NOT_A_MAPPING = ("model_type", "model_attributes_type", "dict_type")


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """The type under ``Annotated`` layers and ``X | None``, with the Annotated metadata collected."""
    metadata: list[Any] = []
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp, *more = typing.get_args(tp)
            metadata += more
            continue
        members = _members(tp)
        if len(members) == 2 and type(None) in members:
            tp = next(m for m in members if m is not type(None))
            continue
        return tp, metadata


def _members(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return ()


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field_type(model: type[BaseModel], name: Any) -> Any:
    for field_name, info in model.model_fields.items():
        if name in (field_name, info.alias):
            return info.rebuild_annotation()
    return None


def field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _walk(root: Any, loc: Sequence[Any]) -> tuple[list[Any], Any, Any]:
    """(the location without union-branch labels, the type at it, the type of its parent).

    Where the type is a union of several types, pydantic adds a label per branch to the location; the
    label is dropped and, past it, the type is unknown (None)."""
    path: list[Any] = []
    tp, parent = root, None
    for part in loc:
        if tp is not None:
            inner, _ = _unwrap(tp)
            if len(_members(inner)) > 1 and isinstance(part, str):
                tp = None  # a branch label, not a key the user wrote
                continue
        path.append(part)
        parent, tp = tp, _child(tp, part)
    return path, tp, parent


def _child(tp: Any, part: Any) -> Any:
    if tp is None:
        return None
    inner, _ = _unwrap(tp)
    if _is_model(inner):
        return _field_type(inner, part)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin in (list, tuple, set, frozenset, Sequence) and args and isinstance(part, int):
        return args[0]
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    return None


def _bounds(metadata: Iterable[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in metadata:
        for attr in ("ge", "gt", "le", "lt"):
            value = getattr(item, attr, None)
            if value is not None:
                found[attr] = value
        for nested in getattr(item, "metadata", ()):  # pydantic's FieldInfo carries them in .metadata
            if isinstance(nested, annotated_types.BaseMetadata):
                found.update(_bounds([nested]))
    return found


def _number(noun: str, article: str, bounds: dict[str, Any]) -> str:
    low = ("ge", bounds["ge"]) if "ge" in bounds else ("gt", bounds["gt"]) if "gt" in bounds else None
    high = ("le", bounds["le"]) if "le" in bounds else ("lt", bounds["lt"]) if "lt" in bounds else None
    if noun == "integer" and low in (("ge", 1), ("gt", 0)) and high is None:
        return "a positive integer"
    if low and high and low[0] == "ge" and high[0] == "le":
        return f"{article} {noun} from {low[1]} to {high[1]}"
    words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
    said = " and ".join(f"{words[bound[0]]} {bound[1]}" for bound in (low, high) if bound)
    return f"{article} {noun}" + (f" {said}" if said else "")


def describe(tp: Any) -> str | None:
    """What a value of this type is, as a spec's author would say it; None when there is no short way."""
    inner, metadata = _unwrap(tp)
    members = _members(inner)
    if members:
        parts = [describe(m) for m in members]
        return None if None in parts else " or ".join(dict.fromkeys(p for p in parts if p))
    if typing.get_origin(inner) is typing.Literal:
        values = [json.dumps(v) for v in typing.get_args(inner)]
        return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"
    bounds = _bounds(metadata)
    if inner is bool:
        return "true or false"
    if inner is int:
        return _number("integer", "an", bounds)
    if inner is float:
        return _number("number", "a", bounds)
    if inner is str or inner is SecretStr:
        return "a string"
    if inner is type(None):
        return "null"
    origin = typing.get_origin(inner) or inner
    if origin in (list, tuple, set, frozenset):
        return "a list"
    if origin in (dict, Mapping) or _is_model(inner):
        return "a mapping"
    return None


def _got(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def suggestion(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate the user most likely meant: a close spelling, an abbreviation (learning_rate: lr),
    or the one candidate that contains the word or is contained in it (batch_size: global_batch_size)."""
    candidates = [c for c in candidates if c != word]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = word.lower()
    initials = "".join(part[0] for part in lowered.replace("-", "_").split("_") if part)
    if len(initials) > 1 and initials in candidates:
        return initials
    if len(lowered) >= 3:
        containing = [c for c in candidates if lowered in c or (len(c) >= 3 and c in lowered)]
        if len(containing) == 1:
            return containing[0]
    return None


def _message(error: Mapping[str, Any], tp: Any, parent: Any, path: Sequence[Any]) -> str:
    kind = str(error.get("type", ""))
    if kind == "extra_forbidden":
        known = field_names(_unwrap(parent)[0]) if parent is not None and _is_model(_unwrap(parent)[0]) else []
        close = suggestion(str(path[-1]), known) if path else None
        if close:
            return f'unknown field; did you mean "{close}"?'
        return f"unknown field; known: {', '.join(known)}" if known else "unknown field"
    if kind == "missing":
        return "required"
    what = describe(tp) if tp is not None else None
    # A secret's value never comes back, not even in its own refusal.
    got = "a value not shown" if path and path[0] == "secrets" else _got(error.get("input"))
    ctx = error.get("ctx") or {}
    if ("too_long" in kind or "too_short" in kind) and ("max_length" in ctx or "min_length" in ctx):
        # The right type, the wrong size: say which size, counted as the user counts it.
        unit = "characters" if isinstance(error.get("input"), str) else "items"
        limit = f"at most {ctx['max_length']}" if "too_long" in kind else f"at least {ctx['min_length']}"
        return f"must have {limit} {unit}; got {got if path and path[0] == 'secrets' else len(error.get('input') or ())}"
    if what and any(marker in kind for marker in _TYPE_ERRORS):
        message = f"must be {what}; got {got}"
        literal = [v for v in _literals(tp) if isinstance(v, str)]
        if isinstance(error.get("input"), str) and literal and (close := suggestion(error["input"], literal)):
            message += f'; did you mean "{close}"?'
        return message
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    # A type this module does not describe: pydantic's own words, in the same form as the rest.
    return "must be " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else msg


def _literals(tp: Any) -> list[Any]:
    inner, _ = _unwrap(tp)
    if typing.get_origin(inner) is typing.Literal:
        return list(typing.get_args(inner))
    return [v for m in _members(inner) for v in _literals(m)]


def user_problems(errors: Iterable[Mapping[str, Any]], roots: Sequence[Any] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """(location, message) per field, in the order pydantic reported them; one message per field.

    ``roots`` are the candidate types of the validated value (a spec's kinds); the one under which most
    of the locations resolve explains them. Without roots, only pydantic's own messages are cleaned."""
    errors = list(errors)
    root = max(roots, key=lambda r: sum(_walk(r, e["loc"])[1] is not None for e in errors), default=None) if roots else None
    merged: dict[tuple[Any, ...], str] = {}
    for error in errors:
        if root is not None and len(error["loc"]) == 1 and error.get("type") in _NOT_A_MAPPING:
            # The whole value is not a mapping: pydantic names the union member it tried ("catalog"), not a field.
            merged.setdefault((), f"must be a mapping of fields; got {_got(error.get('input'))}")
            continue
        path, tp, parent = _walk(root, error["loc"]) if root is not None else (list(error["loc"]), None, None)
        if len(path) < len(error["loc"]):  # a union branch: described whole from the field's own annotation
            tp = _field_at(root, path)
        key = tuple(path)
        if key not in merged:
            merged[key] = _message(error, tp, parent, path)
    return list(merged.items())


def _field_at(root: Any, path: Sequence[Any]) -> Any:
    tp = root
    for part in path:
        tp = _child(tp, part)
    return tp
