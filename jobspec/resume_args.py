"""A script job's ``resume_args``: arguments added only to an attempt that resumes, with ``{checkpoint}``
standing for the latest complete checkpoint found (its absolute path). ``{{`` and ``}}`` are literal braces.
Pure functions: the spec checks templates at submission, the worker renders them at launch."""

from __future__ import annotations

import string

PLACEHOLDER = "checkpoint"
_FORMATTER = string.Formatter()


def template_problem(arg: str) -> str | None:
    """Why ``arg`` is not a valid resume argument template (None when it is)."""
    try:
        parts = list(_FORMATTER.parse(arg))
    except ValueError as exc:
        return f"{arg!r} is not a valid template ({exc}); write {{checkpoint}} for the checkpoint and {{{{ }}}} for a literal brace"
    for _text, field, spec, conversion in parts:
        if field is None:
            continue
        if field != PLACEHOLDER or spec or conversion:
            shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            return f"{arg!r}: {shown} is not a placeholder; the only one is {{checkpoint}} (write {{{{ }}}} for a literal brace)"
    return None


def render(args: list[str], checkpoint: str) -> list[str]:
    """``args`` with ``{checkpoint}`` replaced; each template must have passed ``template_problem``."""
    out = []
    for arg in args:
        pieces = []
        for text, field, _spec, _conversion in _FORMATTER.parse(arg):
            pieces.append(text)
            if field is not None:
                pieces.append(checkpoint)
        out.append("".join(pieces))
    return out
