"""Packages built against torch in a job's ``requirements``: they must be the build of the worker's own torch.

torchvision, torchaudio, torchtext and their like carry compiled operators linked to one torch build, and pin it
exactly (``torch==2.13.0``); each torch build (``+cpu``, ``+cu128`` ...) has its own build of them, with the same
local version label, on the index that torch build comes from. PyPI has one build per version (on Linux, CUDA's),
without a label; installed beside a ``+cpu`` torch it fails at its first operator (``operator torchvision::nms does
not exist``). So a job's environment also resolves from the worker's torch index (whose labelled builds sort above
PyPI's), and what pip chose is checked before any rank starts: a platform wheel that pins torch exactly must carry
torch's label, else the job is refused naming the package, the build found and the build needed.

Pure-Python packages (``lightning``: ``py3-none-any``, ``torch>=2.1``) are not builds of torch and pass unchecked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from jobs.settings import Settings

# Written by `make install` and the worker image beside the interpreter: the index torch was installed from.
RECORDED = Path(sys.prefix) / "torchyard-torch-index-url"
INDEX_SETTING = "TORCHYARD_TORCH_INDEX_URL"


def index_url(settings: Settings, recorded: Path = RECORDED) -> str | None:
    """The worker's torch index: the setting, else what the install recorded; None when pip's own configuration
    already served torch (then it serves the job's environments the same way)."""
    if settings.torch_index_url:
        return settings.torch_index_url
    try:
        return recorded.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _label(version: str) -> str | None:
    try:
        return Version(version).local
    except InvalidVersion:
        return None


def _torch_pin(requires_dist: list[str]) -> str | None:
    """The torch version a package pins exactly (``torch==X``), None when it pins none."""
    for line in requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "torch":
            continue
        exact = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if exact:
            return exact[0]
    return None


def _platform_wheel(url: str) -> bool:
    """A wheel with compiled code: not ``*-none-any``."""
    name = unquote(Path(urlsplit(url).path).name)
    try:
        _, _, _, tags = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return any(t.platform != "any" for t in tags)


def describe(label: str | None) -> str:
    return f"its +{label} build" if label else "a build without a local version label (PyPI's, built for CUDA on Linux)"


def mismatches(installed: list[dict[str, Any]], torch_version: str) -> list[str]:
    """What pip's report (its ``install`` entries) chose that is built for another torch build than ``torch_version``,
    each said in a user's words; empty when every torch-built package matches."""
    needed = _label(torch_version)
    said = []
    for entry in installed:
        meta = entry.get("metadata") or {}
        name, version = str(meta.get("name", "?")), str(meta.get("version", "?"))
        pin = _torch_pin(list(meta.get("requires_dist") or []))
        if pin is None or not _platform_wheel(str((entry.get("download_info") or {}).get("url", ""))):
            continue
        found = _label(version)
        if found == needed:
            continue
        base = version.split("+", 1)[0]
        want = f"{base}+{needed}" if needed else base
        said.append(f"{name} {version} is compiled against torch and was found only as {describe(found)} for torch {pin}; "
                    f"this worker's torch is {torch_version}, which needs {name} {want}")
    return said


def refusal(problems: list[str], index: str | None) -> str:
    where = (f"the worker's torch index ({index}) has no such build either" if index else
             f"{INDEX_SETTING} is not set on this worker, so only pip's configured indexes were searched")
    return (f"requirements: {'; '.join(problems)}. {where}: the operator sets the index of the worker's torch build "
            f"(`make install TORCH_INDEX_URL=...`, or {INDEX_SETTING}, e.g. https://download.pytorch.org/whl/cpu), or pin a "
            "version that index has")
