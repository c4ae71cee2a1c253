"""/v1/jobs/{id}/artifacts: list and download the files a job wrote under its run's ``artifacts/`` directory
(TensorBoard event files, profiler traces, whatever a script saves there).

Owner only, like every job route. A download is opened once with ``jobs.artifacts.open_under`` (no symlink
followed at any component, regular files only) and served from that descriptor, so ``..``, absolute paths,
percent-encoded traversal, symlinks out of the directory and files with more than one hard link all answer 404.
One byte range per request is served (api.ranges).
"""

from __future__ import annotations

import mimetypes
import os
import re
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from api import ranges
from api.auth import PrincipalDep
from api.deps import SessionDep, SettingsDep
from api.errors import responses
from jobs import artifacts, service

router = APIRouter(prefix="/v1/jobs", tags=["artifacts"])

JobId = Annotated[str, Path(min_length=1, max_length=64, description="Job id.")]
ArtifactPath = Annotated[str, Path(min_length=1, max_length=1024, description="Path relative to the run's artifacts/ directory.")]
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_FILE = {**ranges.file_responses("The file's bytes, with the media type its name suggests.", media_type="*/*"), **responses(416)}


class ArtifactOut(BaseModel):
    path: str = Field(description="Relative to the run's artifacts/ directory; download it at /v1/jobs/{id}/artifacts/{path}.")
    size_bytes: int
    modified: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    truncated: bool = Field(description=f"True when the directory holds more than {artifacts.MAX_LISTED} files and only the "
                                        "first (by path) are listed.")


@router.get("/{job_id}/artifacts", response_model=ArtifactList, summary="Files under the run's artifacts/ directory, by path")
def list_artifacts(job_id: JobId, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> ArtifactList:
    job = service.get_job(session, principal.owner, job_id)
    found = artifacts.list_artifacts(artifacts.job_dir(settings, job.id), artifacts.MAX_LISTED + 1)
    items = [ArtifactOut(path=p, size_bytes=size, modified=datetime.fromtimestamp(mtime, timezone.utc))
             for p, size, mtime in found[:artifacts.MAX_LISTED]]
    return ArtifactList(items=items, truncated=len(found) > artifacts.MAX_LISTED)


@router.get("/{job_id}/artifacts/{path:path}", response_class=StreamingResponse, responses=_FILE,
            summary="Download one file of the run's artifacts/ directory")
def get_artifact(job_id: JobId, path: ArtifactPath, principal: PrincipalDep, session: SessionDep,
                 settings: SettingsDep, range_header: ranges.RangeHeader = None) -> StreamingResponse:
    job = service.get_job(session, principal.owner, job_id)
    try:
        f = artifacts.open_artifact(artifacts.job_dir(settings, job.id), path)
    except FileNotFoundError:
        raise service.FileUnavailable(f"job {job_id} has no artifact {path!r}") from None
    size = os.fstat(f.fileno()).st_size
    name = _SAFE_NAME.sub("_", path.rsplit("/", 1)[-1])
    media = mimetypes.guess_type(name)[0] if not name.endswith(".gz") else "application/gzip"
    return ranges.file_response(f, size, name, media or "application/octet-stream", range_header)
