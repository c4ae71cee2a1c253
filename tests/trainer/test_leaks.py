"""The worker's own rich is hidden from a script's ranks (Lightning then picks tqdm), unless the job asks for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import ROOT

PROBE = textwrap.dedent('''
    import json, sys
    from importlib import metadata
    from trainer import leaks
    hidden = sorted(leaks.hide(run_dir=sys.argv[1]))
    try:
        import rich
        imported = True
    except ModuleNotFoundError:
        imported = False
    try:
        version = metadata.version("rich")
    except metadata.PackageNotFoundError:
        version = None
    import importlib.util
    listed = any(d.metadata["Name"] == "rich" for d in metadata.distributions())
    print(json.dumps({"hidden": hidden, "imported": imported, "version": version, "spec": importlib.util.find_spec("rich") is not None,
                      "typer": bool(metadata.version("typer")), "listed": listed}))
''')


def _probe(run_dir: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(run_dir)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_rich_is_hidden_unless_the_requirements_name_it(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(json.dumps({"requirements": ["tqdm==4.67.1"]}))
    assert _probe(tmp_path) == {"hidden": ["rich"], "imported": False, "version": None, "spec": False, "typer": True, "listed": False}
    (tmp_path / "spec.json").write_text(json.dumps({"requirements": ["Rich>=13"]}))
    shown = _probe(tmp_path)
    assert shown["hidden"] == [] and shown["imported"] and shown["version"] and shown["spec"] and shown["listed"]
