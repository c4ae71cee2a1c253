"""The SDK and the client import as ``torchyard``, also where the user's own trainer.py, client.py and cli.py come first."""

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
    sys.path.insert(0, sys.argv[1])
    import trainer                     # the user's own, imported before torchyard
    from torchyard import Client, report
    import client, cli                 # the user's own, imported after
    import torchyard.report
    report.metrics(3, loss=0.5)
    report.close()
    print(json.dumps({"trainer": trainer.MINE, "client": client.MINE, "cli": cli.MINE, "same": torchyard.report is report,
                      "client_class": Client.__module__, "report": report.__name__}))
''')


def test_users_trainer_and_client_modules_stay_theirs_beside_torchyard(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "trainer.py").write_text("MINE = 'user trainer'\nclass Trainer: pass\n")
    (code / "client.py").write_text("MINE = 'user client'\n")
    (code / "cli.py").write_text("MINE = 'user cli'\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHYARD_RUN_DIR": str(run_dir)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(code)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"trainer": "user trainer", "client": "user client", "cli": "user cli", "same": True,
                   "client_class": "torchyard.client.client", "report": "torchyard.report"}
    # The SDK wrote where a job's rank writes: events.jsonl in the run directory.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["type"] == "metric" and e["values"] == {"loss": 0.5} for e in events)


def test_the_sdks_older_name_in_jobs_is_the_same_module() -> None:
    import torchyard
    from torchyard import client
    from trainer import report

    assert torchyard.report is report and torchyard.Client is client.Client
