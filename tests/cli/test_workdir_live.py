"""Your own code from your laptop, end to end: a live API and worker, real torchrun.

The unmodified plain DDP example submitted with ``torchyard submit --workdir`` from a directory outside
the code root runs from its uploaded bundle and its output is in the default log; a job's
``requirements`` install into a cached environment its script imports from; a failed install fails the
job as ``setup_error`` with pip's message."""

from __future__ import annotations

import importlib.util
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import cli
from tests.helpers import ROOT, Services
from torchyard.client import Client

pytestmark = pytest.mark.slow

PACKAGE, VERSION = "toolz", "1.0.0"  # tiny, pure Python, no dependencies, not installed in the worker's environment


def test_plain_ddp_script_from_a_workdir_runs_and_its_output_is_the_default_log(live: Services, tmp_path: Path) -> None:
    work = tmp_path / "laptop" / "project"  # nowhere near the code root
    work.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "scripts" / "ddp_plain.py", work / "ddp_plain.py")
    (work / ".gitignore").write_text("*.ckpt\n")
    (work / "old.ckpt").write_bytes(b"\0" * 4096)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"kind": "script", "name": "plain-workdir", "entrypoint": "ddp_plain.py", "args": ["2", "1"],
                                    "parallel": {"nproc_per_node": 2}}))

    code, out = cli(live, "submit", str(spec), "--workdir", str(work), "--follow")
    assert code == 0, out
    job_id = out.split("submitted ")[1].split()[0]
    with Client(live.url, live.headers["Authorization"].removeprefix("Bearer ")) as client:
        job = client.job(job_id)
    assert job.status == "succeeded" and job.spec["code"].startswith("sha256:")
    assert not (live.settings.code_dir / "ddp_plain.py").exists()

    # The default log: both ranks' output as they printed it, each line prefixed.
    code, merged = cli(live, "logs", job_id)
    assert code == 0, merged
    for rank in (0, 1):
        assert any(line.startswith(f"[rank {rank}] ") and f"[rank {rank}] Epoch 1 | Batchsize: 32" in line
                   for line in merged.splitlines()), merged
    code, rank0 = cli(live, "logs", job_id, "--rank", "0")
    assert code == 0 and "Epoch 0 | Training snapshot saved at snapshot.pt" in rank0 and "[rank 1]" not in rank0
    code, launcher = cli(live, "logs", job_id, "--rank", "launcher")
    assert code == 0 and "Epoch" not in launcher

    # The job ran from its own read-only copy of the bundle; ignored files never left the laptop.
    run_code = Path(job.run_dir or "") / "code"
    assert (run_code / "ddp_plain.py").read_bytes() == (work / "ddp_plain.py").read_bytes()
    assert not (run_code / "old.ckpt").exists() and not (run_code / ".git").exists()
    assert stat.S_IMODE(run_code.stat().st_mode) == 0o555 and stat.S_IMODE((run_code / "ddp_plain.py").stat().st_mode) == 0o444
    # It started in its writable copy of the bundle, where the tutorial's relative snapshot.pt landed.
    assert (Path(job.run_dir or "") / "workdir" / "snapshot.pt").is_file() and not (run_code / "snapshot.pt").exists()

    # The same directory again is not uploaded again.
    code, out = cli(live, "submit", str(spec), "--workdir", str(work), "--json")
    assert code == 0, out
    code, out = cli(live, "submit", str(spec), "--workdir", str(work))
    assert code == 0 and "already on the server" in out, out


def test_requirements_install_once_and_a_failed_install_is_a_setup_error(live: Services, tmp_path: Path) -> None:
    assert importlib.util.find_spec("toolz") is None, "the test package must not be in the worker's environment already"
    work = tmp_path / "work"
    (work / "scripts").mkdir(parents=True)
    (work / "mylib.py").write_text("WHERE = 'the bundle root'\n")
    # In a subdirectory, importing a module at the bundle's root: the rank bootstrap put the bundle first on sys.path.
    (work / "scripts" / "uses_dep.py").write_text(
        "import os, sys, toolz, torch, mylib\n"
        "print('first', toolz.first([42, 7]), 'with torch', torch.__version__, flush=True)\n"
        "print('python', sys.prefix, file=sys.stderr)\n"
        "print('mylib from', mylib.WHERE, 'code dir', os.environ['TORCHYARD_CODE_DIR'], flush=True)\n")
    spec = {"kind": "script", "name": "needs-dep", "entrypoint": "scripts/uses_dep.py", "parallel": {"nproc_per_node": 1},
            "requirements": [f"{PACKAGE}=={VERSION}"]}
    venvs = live.settings.venvs_root
    with Client(live.url, live.headers["Authorization"].removeprefix("Bearer ")) as client:
        first = client.submit(spec, workdir=work)
        second = client.submit({**spec, "name": "needs-dep-again"}, workdir=work)
        bad = client.submit({**spec, "name": "bad-dep", "requirements": ["torchyard-no-such-package==0.0.1"]}, workdir=work)
        for job_id in (first.id, second.id):
            job = client.wait(job_id, timeout=300, poll_interval=0.5)
            assert job.status == "succeeded", job.error
            log = client.logs(job_id)
            assert "[rank 0] first 42 with torch 2.13.0" in log, log
            assert f"[rank 0] python {venvs}" in log  # the ranks ran in the job's environment
            run_code = Path(client.job(job_id).run_dir or "").resolve() / "workdir"  # the job's writable copy of the bundle
            assert f"[rank 0] mylib from the bundle root code dir {run_code}" in log, log
        failed = client.wait(bad.id, timeout=300, poll_interval=0.5)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.type == "setup_error"
    assert "torchyard-no-such-package" in (failed.error.message or "") and "pip install failed" in (failed.error.message or "")
    assert failed.attempt == 1  # not retried: the same install would fail the same way
    # Built once for both jobs: one environment (and its symlink), and nothing left of the failed build.
    built = [p for p in venvs.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(built) == 1 and len([p for p in venvs.iterdir() if p.is_symlink()]) == 1
    assert not list(live.settings.runs_dir.glob("*/.code-*"))  # unpacking leaves no temporary copy behind
    assert not list(live.settings.runs_dir.glob("*/.workdir-*"))  # nor does copying it into the working directory
