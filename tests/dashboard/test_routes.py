"""The dashboard's routes on a bare FastAPI app: the page, its assets, its security headers, and
that everything it loads is served from here (no CDN at run time)."""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient

import dashboard
from dashboard.routes import STATIC_DIR


def test_page_and_assets_are_served_with_a_strict_policy() -> None:
    app = FastAPI()
    dashboard.mount(app)
    dashboard.mount(app)  # idempotent: api/app.py and a test may both mount it
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
        assert client.head("/").status_code == 200
        refs = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
        assert {"/static/app.js", "/static/style.css", "/static/vendor/uPlot.iife.min.js"} <= set(refs)
        for ref in refs:
            assert not ref.startswith(("http:", "https:", "//")), f"{ref} would load from another origin"
            if ref.startswith("/static/"):
                assert client.get(ref).status_code == 200, ref
        assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
        assert client.get("/static/nope.js").status_code == 404
    assert [r.path for r in app.routes].count("/") == 1


def test_vendored_chart_library_keeps_its_license() -> None:
    vendor = STATIC_DIR / "vendor"
    assert "MIT License" in (vendor / "uPlot.LICENSE").read_text()
    assert (vendor / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32)")


def test_page_script_never_writes_html_from_data() -> None:
    # Job names, log lines and error messages reach the page; only textContent may put them there.
    for module in STATIC_DIR.glob("*.js"):
        script = module.read_text()
        assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script, module.name


def test_every_module_the_page_imports_is_served() -> None:
    app = FastAPI()
    dashboard.mount(app)
    seen: set[str] = set()
    todo = ["app.js"]
    with TestClient(app) as client:
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            resp = client.get(f"/static/{name}")
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/javascript"), name
            todo += re.findall(r'^import .*? from "\./([\w-]+\.js)";$', resp.text, flags=re.M)
    # Each module is reached from app.js: none is left behind unused.
    assert seen == {p.name for p in STATIC_DIR.glob("*.js")}
