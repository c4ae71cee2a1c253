"""A job's files: consolidated weights, directory checkpoints as tar files, and the artifacts it wrote, each
streamed to disk and written whole or not at all."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from torchyard.client.errors import ConnectionFailed, error_from_response
from torchyard.client.http import HttpSession, job_path, segment
from torchyard.client.models import Artifact


class DownloadsApi(HttpSession):
    def download_weights(self, job_id: str, dest: str | Path | None = None, *, step: int | None = None) -> Path:
        """Save the consolidated weights of the latest checkpoint that has them (or of ``step``) to ``dest``
        (a file, or a directory to put the server's file name in; default the current directory)."""
        path = job_path(job_id, "weights") if step is None else job_path(job_id, "checkpoints", step, "weights")

        def target_for(response: httpx.Response) -> Path:
            target = Path(dest) if dest is not None else Path.cwd()
            if target.is_dir():
                target = target / (_attachment_name(response.headers.get("content-disposition")) or f"{job_id}.safetensors")
            return target

        return self._download(path, target_for)

    def download_checkpoint_archive(self, job_id: str, step: int, dest: str | Path | None = None) -> Path:
        """Save a directory checkpoint (a Hugging Face ``checkpoint-N/``, an Accelerate ``save_state`` directory) as a
        tar file to ``dest`` (a file, or a directory to put the server's file name in; default the current directory)."""

        def target_for(response: httpx.Response) -> Path:
            target = Path(dest) if dest is not None else Path.cwd()
            if target.is_dir():
                target = target / (_attachment_name(response.headers.get("content-disposition")) or f"{job_id}-step{step}.tar")
            return target

        return self._download(job_path(job_id, "checkpoints", step, "archive"), target_for)

    def artifacts(self, job_id: str) -> list[Artifact]:
        """Files the job wrote under its run's ``artifacts/`` directory (TensorBoard events, profiler traces ...)."""
        return [Artifact.model_validate(a) for a in self._json("GET", job_path(job_id, "artifacts"))["items"]]

    def download_artifact(self, job_id: str, path: str, dest: str | Path) -> Path:
        """Save the artifact ``path`` (relative to ``artifacts/``) to the file ``dest``, creating its directory."""
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        quoted = "/".join(segment(part) for part in path.split("/"))
        return self._download(job_path(job_id, "artifacts", quoted), lambda _: target)

    def _download(self, path: str, target_for: Callable[[httpx.Response], Path]) -> Path:
        """Stream ``path`` into the file ``target_for(response)`` names, written whole or not at all."""
        try:
            with self._http.stream("GET", path, headers={"Accept": "application/octet-stream"}) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                target = target_for(response)
                tmp = target.with_name(f".{target.name}.part")
                with tmp.open("wb") as out:
                    for block in response.iter_bytes(1 << 20):
                        out.write(block)
                tmp.replace(target)  # never a half-written file under the final name
                return target
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"download from {self.url} broke: {exc}") from exc


def _attachment_name(disposition: str | None) -> str | None:
    """The file name of a Content-Disposition header, without any directory part."""
    if not disposition:
        return None
    for part in disposition.split(";"):
        key, _, value = part.strip().partition("=")
        if key.lower() == "filename" and value:
            return Path(value.strip('"')).name or None
    return None
