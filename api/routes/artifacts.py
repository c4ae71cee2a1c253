"""/v1/jobs/{id}/artifacts: list and download the files a job wrote under its run's ``artifacts/`` directory
(TensorBoard event files, profiler traces, whatever a script saves there), and those a script job wrote or changed
in its working directory, listed as ``workdir/<path>`` (jobs/reads/workdir_files.py; the uploaded files are not listed).
A file under ``artifacts/workdir/`` is served before a working-directory file of the same path.

Owner only, like every job route. A download is opened once with ``jobs.reads.artifacts.open_under`` (no symlink
followed at any component, regular files only) and served from that descriptor, so ``..``, absolute paths,
percent-encoded traversal, symlinks out of the directory and files with more than one hard link all answer 404.
One byte range per request is served (api.ranges).
"""

from __future__ import annotations

import mimetypes
import re
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from api import ranges
from api.auth import PrincipalDep
from api.deps import JobId, SessionDep, SettingsDep
from api.errors import responses
from jobs.reads import artifact_files, artifacts, job_lookup
from jobs.storage.stored_file import size_of

router = APIRouter(prefix="/v1/jobs", tags=["artifacts"])

ArtifactPath = Annotated[str, Path(min_length=1, max_length=1024, description="Path relative to the run's artifacts/ directory.")]
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_FILE = {**ranges.file_responses("The file's bytes, with the media type its name suggests.", media_type="*/*"), **responses(416)}


class ArtifactOut(BaseModel):
    path: str = Field(description="Relative to the run's artifacts/ directory, or workdir/<path> for a file the job wrote or "
                                  "changed in its working directory; download it at /v1/jobs/{id}/artifacts/{path}.")
    size_bytes: int
    modified: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    truncated: bool = Field(description=f"True when artifacts/ or the working directory holds more than {artifacts.MAX_LISTED} "
                                        "files and only the first (by path) of each are listed.")


@router.get("/{job_id}/artifacts", response_model=ArtifactList,
            summary="Files under the run's artifacts/ directory and those the job wrote in its working directory, by path")
def list_artifacts(job_id: JobId, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> ArtifactList:
    job = job_lookup.get_job(session, principal.scope, job_id)
    listed, truncated = artifact_files.list_files(settings, job.id)
    return ArtifactList(items=[ArtifactOut(path=p, size_bytes=size, modified=datetime.fromtimestamp(mtime, timezone.utc))
                               for p, (size, mtime) in listed.items()], truncated=truncated)


@router.get("/{job_id}/artifacts/{path:path}", response_class=StreamingResponse, responses=_FILE,
            summary="Download one file of the run's artifacts/ directory, or workdir/<path> the job wrote")
def get_artifact(job_id: JobId, path: ArtifactPath, principal: PrincipalDep, session: SessionDep,
                 settings: SettingsDep, range_header: ranges.RangeHeader = None) -> StreamingResponse:
    job = job_lookup.get_job(session, principal.scope, job_id)
    try:
        f = artifact_files.open_file(settings, job.id, path)
    except FileNotFoundError:
        where = " in the object store" if settings.storage_url is not None else ""
        raise artifacts.FileUnavailable(f"job {job_id} has no artifact {path!r}{where}") from None
    size = size_of(f)
    name = _SAFE_NAME.sub("_", path.rsplit("/", 1)[-1])
    media = mimetypes.guess_type(name)[0] if not name.endswith(".gz") else "application/gzip"
    return ranges.file_response(f, size, name, media or "application/octet-stream", range_header)
