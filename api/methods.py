"""Which methods a path answers, from the app's own routes: the one source of every ``Allow`` header.

Starlette answers 405 with the methods of the first route whose path matched, so ``/v1/jobs/{id}``
(a GET route and a DELETE route) said ``Allow: GET``. Here every route whose path matches counts,
and ``OPTIONS`` on a known path answers 204 with the full list.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.routing import Match, Mount

# A mounted app (the dashboard's static files) serves files: it answers these.
_MOUNT_METHODS = frozenset({"GET", "HEAD"})
_PROBED = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
NO_SUCH_PATH = "no such path in this API (see /docs)"


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route of ``app`` answers at ``path``, OPTIONS included; empty when no route has the path.

    Each method is asked of each route as the router would (included routers answer for their own routes)."""
    found: set[str] = set()
    for route in app.router.routes:
        if getattr(route, "_answers_options", False):
            continue
        if isinstance(route, Mount):
            if route.matches({"type": "http", "path": path, "method": "GET", "root_path": ""})[0] is not Match.NONE:
                found |= _MOUNT_METHODS
            continue
        for method in _PROBED:
            if method not in found and route.matches({"type": "http", "path": path, "method": method, "root_path": ""})[0] is Match.FULL:
                found.add(method)
    return sorted(found | {"OPTIONS"}) if found else []


def allow_header(app: FastAPI, path: str) -> str:
    return ", ".join(allowed_methods(app, path))


def install(app: FastAPI) -> None:
    """``OPTIONS`` on every path, answered from the routes (no route of this app answers OPTIONS itself)."""

    async def options(request: Request) -> Response:
        methods = allowed_methods(request.app, request.url.path)
        if not methods:
            raise HTTPException(404, NO_SUCH_PATH)
        return Response(status_code=204, headers={"Allow": ", ".join(methods)})

    app.add_api_route("/{path:path}", options, methods=["OPTIONS"], include_in_schema=False)
    route = app.router.routes.pop()
    route._answers_options = True  # type: ignore[attr-defined]
    # First: it matches OPTIONS alone, and a mount (which takes every method) must not answer OPTIONS before it.
    app.router.routes.insert(0, route)
