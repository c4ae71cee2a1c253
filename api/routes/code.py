"""/v1/code: upload a working directory as a code bundle, and ask whether one is stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.auth import PrincipalDep
from api.deps import SettingsDep
from api.errors import problem, responses
from jobs.code_bundles import files as bundles
from jobs.code_bundles import stored as stored_bundles

router = APIRouter(prefix="/v1/code", tags=["code"])

Digest = Annotated[str, Path(pattern=r"^sha256:[0-9a-f]{64}$", description="'sha256:' and the archive's 64 hex digits.")]
_TAR_BODY = {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
             "description": "An uncompressed tar archive, any Content-Type (application/x-tar is apt); send it "
                            "with Content-Encoding: gzip to save bandwidth."}


class CodeBundleOut(BaseModel):
    digest: str = Field(description="'sha256:<hex>' of the tar archive; put it in a script spec's `code`.")
    size_bytes: int = Field(description="Size of the tar archive.")
    files: int = Field(description="Regular files in the bundle.")
    created_at: str

    @classmethod
    def of(cls, b: bundles.BundleInfo) -> CodeBundleOut:
        return cls(digest=b.digest, size_bytes=b.size_bytes, files=b.files, created_at=b.created_at.isoformat())


@router.post("", response_model=CodeBundleOut, status_code=201, openapi_extra={"requestBody": _TAR_BODY},
             summary="Upload a code bundle (a tar archive); 201 when stored, 200 when this owner already has it",
             responses={200: {"model": CodeBundleOut, "description": "This owner already has a bundle with this digest."},
                        **responses(415)})
async def upload_code(
    request: Request, principal: PrincipalDep, settings: SettingsDep, response: Response,
    content_encoding: Annotated[str | None, Header(max_length=32, description="gzip, or none.")] = None,
    digest: Annotated[str | None, Query(pattern=r"^sha256:[0-9a-f]{64}$",
                                        description="The archive's digest as the client computed it: a known one answers 200 "
                                                    "without reading the body, another one is refused if the body differs.")] = None,
) -> CodeBundleOut:
    if digest is not None and await run_in_threadpool(bundles.exists, settings, principal.owner, digest):
        response.status_code = 200
        await run_in_threadpool(stored_bundles.publish, settings, principal.owner, digest)
        return CodeBundleOut.of(await run_in_threadpool(bundles.info, settings, principal.owner, digest))
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise HTTPException(415, f"Content-Encoding {content_encoding!r} is not supported; send gzip or no encoding")
    declared = request.headers.get("content-length")
    if encoding == "identity" and declared and declared.isdigit() and int(declared) > settings.max_code_bytes:
        raise bundles.BundleTooLarge(f"code bundle is larger than {settings.max_code_bytes} bytes (TORCHYARD_MAX_CODE_BYTES)")
    upload = await run_in_threadpool(bundles.Upload, settings, principal.owner, gzip=encoding == "gzip")
    try:
        async for chunk in request.stream():
            if chunk:
                await run_in_threadpool(upload.write, chunk)
        stored = await run_in_threadpool(upload.finish, digest)
    finally:
        await run_in_threadpool(upload.abort)
    # Workers on hosts that do not share this disk take the archive from the object store (a no-op without one).
    await run_in_threadpool(stored_bundles.publish, settings, principal.owner, stored.digest)
    response.status_code = 201 if stored.created else 200
    return CodeBundleOut.of(stored)


# Out of the OpenAPI schema: a HEAD answer has no body, which the schema's problem+json errors cannot describe.
@router.head("/{digest}", include_in_schema=False)
def code_exists(digest: Digest, principal: PrincipalDep, settings: SettingsDep) -> Response:
    return Response(status_code=200 if bundles.exists(settings, principal.owner, digest) else 404)


@router.get("/{digest}", response_model=CodeBundleOut, summary="A stored bundle's size and file count")
def code_info(digest: Digest, principal: PrincipalDep, settings: SettingsDep) -> CodeBundleOut:
    return CodeBundleOut.of(bundles.info(settings, principal.owner, digest))


def install(app: FastAPI) -> None:
    """The routes, and the answers to an archive that cannot be a bundle."""
    app.include_router(router)

    @app.exception_handler(bundles.BundleRefused)
    async def _refused(_: Request, exc: bundles.BundleRefused) -> JSONResponse:
        return problem(422, f"code bundle refused: {exc}", errors=[{"field": "body", "message": str(exc)}], member=exc.member)

    @app.exception_handler(bundles.BundleTooLarge)
    async def _too_large(_: Request, exc: bundles.BundleTooLarge) -> JSONResponse:
        return problem(413, str(exc))

    @app.exception_handler(bundles.BundleMissing)
    async def _missing(_: Request, exc: bundles.BundleMissing) -> JSONResponse:
        return problem(404, str(exc))
