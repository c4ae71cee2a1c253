"""Serve the dashboard from the API process: ``/`` is the single page, ``/static/...`` its assets.

The page talks to the same JSON API with the user's Bearer key (kept in sessionStorage), so it
needs no session, cookie or server-side state of its own; every asset is a committed file, so
nothing is fetched from a CDN or built at run time.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Scripts, styles, fetches and images only from this origin: a job name or log line that reaches
# the page cannot load or run anything even if it slipped past the page's escaping.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page is tiny; always revalidate so a redeploy is seen at once.
    "Cache-Control": "no-cache",
}


def mount(app: FastAPI, prefix: str = "") -> None:
    """Add ``GET {prefix}/`` (the page) and ``{prefix}/static`` (its assets) to ``app``. Idempotent."""
    if getattr(app.state, "dashboard_mounted", False):
        return
    app.mount(f"{prefix}/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")

    @app.api_route(f"{prefix}/", methods=["GET", "HEAD"], include_in_schema=False)
    def dashboard_index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=_PAGE_HEADERS)

    app.state.dashboard_mounted = True
