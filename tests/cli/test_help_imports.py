"""``torchyard --help`` imports nothing of the service, also in the service's own environment where all of it is
importable: the CLI starts as fast on a GPU box as on a laptop, and the client install stays free of it."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT

# The service's packages, torch and the server's frameworks.
NOT_FOR_HELP = ["alembic", "api", "dashboard", "fastapi", "jobs", "manifests", "psycopg", "redis", "rq", "sqlmodel", "stack",
                "torch", "trainer", "uvicorn", "worker"]
PROBE = """
import json, sys
from torchyard.cli.main import app
try:
    app(["--help"], prog_name="torchyard")
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "loaded": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))}))
"""


def test_help_imports_nothing_of_the_service() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *NOT_FOR_HELP], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Usage: torchyard" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1]) == {"code": 0, "loaded": []}
