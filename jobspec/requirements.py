"""What a job's ``requirements`` may say: PEP 508 requirement specifiers from the worker's package index.

A requirement line of pip can also be an option (``--index-url``, ``-e``, ``-r file``), a URL or a
local path; any of those would let a tenant make pip fetch from a host of their choosing or run a
``setup.py`` outside their bundle. Only ``name[extras] <specifiers> ; <markers>`` is accepted here,
so pip resolves every package from the index the operator configured for the workers.
"""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement

MAX_REQUIREMENTS = 64
MAX_REQUIREMENT_CHARS = 200


def requirement_problem(line: str) -> str | None:
    """Why ``line`` cannot be a job requirement, or None when it can."""
    text = line.strip()
    if not text:
        return "empty requirement"
    if text.startswith("-"):
        return "pip options (-e, -r, --index-url ...) are not allowed; give a requirement such as 'tqdm==4.67.1'"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return f"not a requirement specifier ({exc}); give one such as 'tqdm==4.67.1'"
    if req.url:
        return "URL and path requirements ('name @ ...') are not allowed; packages come from the workers' index"
    return None


def canonical(lines: list[str]) -> list[str]:
    """Requirements in one spelling and order, so equal lists share one environment."""
    return sorted({str(Requirement(line.strip())) for line in lines})
