"""Reading docker-compose.yml the way Docker Compose does, for tests that run where no Docker engine runs.

Only what the tests need: YAML with anchors and merge keys (PyYAML), the compose variable
interpolation rules (``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``, ``${VAR:?e}``,
``${VAR?e}``, ``${VAR:+r}``, ``${VAR+r}``, nested in defaults), and ``.env`` files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
CPU_OVERRIDE = ROOT / "docker-compose.cpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Longest operators first: ":-" must win over "-".
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is missing, or the syntax is invalid."""


def load(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=VALUE lines of a compose .env file; comments and blank lines skipped, no quoting rules needed here."""
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not KEY=VALUE: {line!r}")
        values[key.strip()] = value.strip()
    return values


def referenced_variables(text: str) -> set[str]:
    """Names of every variable a compose file interpolates (escaped ``$$`` excluded)."""
    text = text.replace("$$", "")
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))


def interpolate(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        following = text[i + 1:i + 2]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = _closing_brace(text, i + 1)
            out.append(_expand(text[i + 2:end], env))
            i = end + 1
        elif match := _NAME.match(text, i + 1):
            out.append(env.get(match.group(), ""))
            i = match.end()
        else:
            raise InterpolationError(f"invalid interpolation at {i} in {text!r}")
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise InterpolationError(f"unclosed ${{ in {text!r}")


def _expand(body: str, env: Mapping[str, str]) -> str:
    match = _NAME.match(body)
    if not match:
        raise InterpolationError(f"invalid variable name in ${{{body}}}")
    name, rest = match.group(), body[match.end():]
    if not rest:
        return env.get(name, "")
    is_set, non_empty = name in env, bool(env.get(name))
    for op in _OPERATORS:
        if rest.startswith(op):
            arg = rest[len(op):]
            break
    else:
        raise InterpolationError(f"invalid operator in ${{{body}}}")
    if op == ":-":
        return env[name] if non_empty else interpolate(arg, env)
    if op == "-":
        return env[name] if is_set else interpolate(arg, env)
    if op in (":?", "?"):
        if (op == ":?" and not non_empty) or (op == "?" and not is_set):
            raise InterpolationError(f"required variable {name} is missing a value: {interpolate(arg, env)}")
        return env[name]
    if op == ":+":
        return interpolate(arg, env) if non_empty else ""
    return interpolate(arg, env) if is_set else ""


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string of a parsed compose tree; keys stay as they are, like compose does."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def duration_seconds(duration: str) -> float:
    """A compose duration ("1m30s", "150s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a compose duration: {duration!r}")
    return sum(float(n) * units[u] for n, u in parts)


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` as a dict, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}
