"""Which checkpoint in the store a resume may start from (pure).

A checkpoint's files are uploaded first and its manifest last: the manifest names every file of the checkpoint
with its size. A checkpoint counts only once its manifest is in the store and every file it names is there at that
size, so an upload cut short (no manifest yet, or a file that never arrived or arrived cut) is never resumed from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MANIFEST_NAME = ".torchyard-manifest.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d{1,12})$")


class ManifestError(ValueError):
    """A manifest the store holds that cannot be read: treated as no manifest."""


def step_of(name: str) -> int | None:
    """The step a trainer checkpoint's directory name says (``step_00000050``: 50), else None."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Manifest:
    name: str  # the checkpoint's directory name under checkpoints/
    files: Mapping[str, int] = field(default_factory=dict)  # path relative to the checkpoint -> bytes
    step: int | None = None

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "name": self.name, "step": self.step, "files": dict(sorted(self.files.items()))},
                          indent=1).encode()

    @classmethod
    def from_json(cls, name: str, data: bytes) -> Manifest:
        try:
            doc = json.loads(data)
            files = doc["files"]
            step = doc.get("step")
            ok = (doc.get("format") == FORMAT and doc.get("name") == name and isinstance(files, dict)
                  and all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in files.items())
                  and (step is None or isinstance(step, int)))
        except (ValueError, TypeError, KeyError, AttributeError):
            ok = False
        if not ok:
            raise ManifestError(f"checkpoint {name}: unreadable manifest")
        return cls(name, dict(files), step)


def manifest_key(name: str) -> str:
    """The manifest's key relative to the job's checkpoints/ prefix."""
    return f"{name}/{MANIFEST_NAME}"


def complete(manifest: Manifest, listing: Mapping[str, int]) -> bool:
    """Whether the store holds ``manifest`` and every file it names at its size. ``listing``: key relative to the job's
    checkpoints/ prefix -> size."""
    if manifest_key(manifest.name) not in listing:
        return False
    return all(listing.get(f"{manifest.name}/{path}") == size for path, size in manifest.files.items())


def newest_complete(manifests: Iterable[Manifest], listing: Mapping[str, int]) -> Manifest | None:
    """The checkpoint a resume starts from: of the complete ones, the highest step (a name without one sorts below
    every step), the greatest name among equals; None when none is complete."""
    ready = [m for m in manifests if complete(m, listing)]
    return max(ready, key=lambda m: (m.step if m.step is not None else -1, m.name), default=None)
