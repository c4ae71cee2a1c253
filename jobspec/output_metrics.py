"""Metrics a script only prints, read from its rank 0's output with templates the spec gives.

Most training scripts on GitHub report by printing: nanoGPT's ``iter 10: loss 4.2345, time 120.00ms, mfu 38.10%``.
``metrics.from_output`` names the numbers in such a line with a template written like the line itself::

    iter {step}: loss {train/loss}, time {time_ms}ms, mfu {mfu}%

``{step}`` is the step (a whole number), every other ``{name}`` a metric (any number: ``4.2``, ``-1e-3``, ``nan``),
``{_}`` a number that is not kept, and ``{{``/``}}`` a literal brace. The template matches anywhere in a line;
whitespace in it matches any run of whitespace, and a number may be padded with spaces before it (``| loss  7.60``).
A template without ``{step}`` is at the step printed last (OutputReader): a validation line at the end of an epoch lands
at the train step it follows. Where the first template names no step (a script that prints ``loss 0.53`` alone, or a
step that starts again each epoch), its matches are numbered in order instead, the first at step 1. A template that
starts with ``^`` matches only at the start of a line (``^loss: {loss}`` is not read from ``test loss: 0.1``).

Templates become regular expressions built here from escaped text and fixed number patterns, never the user's own
regular expression: every piece is a plain run of one character class, and two numbers always have text between
them, so matching a line costs time linear in its length (a tenant cannot stall the worker that reads its output).
Pure and stdlib-only: the API checks templates at submission with the same code the worker matches with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_TEMPLATES = 16
MAX_TEMPLATE_CHARS = 512
MAX_LINE_CHARS = 4096  # what of a line is matched: a longer line (a progress bar without newlines) is cut
STEP = "step"
SKIP = "_"
ANCHOR = "^"  # a template starting with it matches only at the start of a line
NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]|\s+|[^{}\s]+")
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Infinity))"
_WHOLE = r"(\d{1,12})"
_LINE_START = r"^\s*"  # an anchored template starts here: the line's start, after its indentation


@dataclass(frozen=True)
class Template:
    """A compiled template: ``names[i]`` is what its ``i``-th number is (``step``, a metric's name, or ``_``)."""

    text: str
    pattern: re.Pattern[str]
    names: tuple[str, ...]

    def readings(self, line: str) -> list[tuple[int | None, list[tuple[str, float]]]]:
        """Each match in ``line``: the step it names (None for a template without ``{step}``) and its metrics' values
        (pure)."""
        found = []
        for match in self.pattern.finditer(line[:MAX_LINE_CHARS]):
            step = int(match.group(self.names.index(STEP) + 1)) if STEP in self.names else None
            values = [(name, float(value)) for name, value in zip(self.names, match.groups(), strict=True)
                      if name not in (STEP, SKIP)]
            found.append((step, values))
        return found


def compile_template(text: str) -> Template:
    """``text`` as a Template; ValueError saying, in a user's words, what is wrong with it."""
    body = text.strip()  # matched anywhere: whitespace at either end adds nothing
    anchored = body.startswith(ANCHOR)
    parts: list[str] = [_LINE_START] if anchored else []
    names: list[str] = []
    after_number = False  # two numbers with nothing between could split one run of digits many ways
    for token in _TOKEN.finditer(body[1:].lstrip() if anchored else body):
        piece, name = token.group(0), token.group(1)
        if name is not None:
            if not NAME.match(name):
                raise ValueError(f"'{{{name}}}' is no metric name: use letters, digits and '_', '.', '-', '/' "
                                 "(at most 128), '{step}' for the step, '{_}' for a number not kept, '{{' for a brace")
            if after_number:
                raise ValueError(f"'{{{name}}}' follows another number with nothing between them; put the text "
                                 "the line has between them into the template")
            if name != SKIP and name in names:
                raise ValueError(f"'{{{name}}}' is named twice")
            # A number may be padded with spaces, unless whitespace of the template's own is just before it or
            # it starts the template (either would let two runs of spaces share one stretch of the line).
            # A template that starts with a number starts a match only where a number starts: tried inside a run of
            # digits, each later start would read the rest of the run again.
            pad = (r"\s*" if parts[-1] not in (r"\s+", _LINE_START) else "") if parts else r"(?<![\d.+\-])"
            parts.append(pad + (_WHOLE if name == STEP else _NUMBER))
            names.append(name)
            after_number = True
        elif piece in ("{", "}"):
            raise ValueError(f"a lone '{piece}': write '{piece * 2}' for a brace the line has, or '{{name}}' for a number")
        else:
            parts.append(r"\s+" if piece.isspace() else re.escape(piece[0] if piece in ("{{", "}}") else piece))
            after_number = False
    if names.count(STEP) > 1:
        raise ValueError("'{step}' is named twice")
    if all(n == SKIP for n in names):
        raise ValueError("names no metric: add '{name}' where the line has a number to keep, or '{step}' for a line "
                         "that says the step")
    return Template(text, re.compile("".join(parts)), tuple(names))


class OutputReader:
    """Points of printed lines through the spec's templates, every match at a step (the policy, pure).

    A match of a template with ``{step}`` is at the step it names. A match of one without is at the step printed
    last (0 before any): the last step a template named, counted on by the first template when it names none, each
    of its matches the next step. A template may name ``{step}`` alone, for a script that prints its step on a line
    of its own. Lines are read oldest first, across the attempts' output, so a new reader gives the same lines the
    same steps.
    """

    def __init__(self, templates: Sequence[Template]):
        self.templates = list(templates)
        self.step = 0

    def points(self, line: str) -> list[tuple[str, int, float]]:
        """The (metric, step, value) the matches of ``line`` give, each template in order."""
        found = []
        for i, template in enumerate(self.templates):
            for named, values in template.readings(line):
                if named is not None:
                    self.step = named
                elif i == 0:
                    self.step += 1
                found.extend((name, self.step, value) for name, value in values)
        return found


def template_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a template, or None (pure)."""
    try:
        compile_template(text)
    except ValueError as exc:
        return str(exc)
    return None
