"""Script specs without services: the kind union, entrypoint resolution against the code root, the env
policy, and the torchrun command and environment the worker builds from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.settings import Settings
from tests.helpers import ROOT
from trainer.spec import (
    JobSpec,
    ScriptJobSpec,
    SpecError,
    SpecLimits,
    env_problem,
    parse_spec,
    resolve_entrypoint,
    spec_from_dict,
    spec_problems,
)
from worker.launch import RESUME_FROM_ENV, RUN_DIR_ENV, torchrun_command, torchrun_env

CATALOG = {"name": "c", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"}}


def script(**fields: object) -> ScriptJobSpec:
    spec = spec_from_dict({"kind": "script", "name": "s", "entrypoint": "train.py", **fields})
    assert isinstance(spec, ScriptJobSpec)
    return spec


@pytest.fixture
def code(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "train.py").write_text("pass\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "fit.py").write_text("pass\n")
    (root / "app").mkdir()
    (root / "app" / "__main__.py").write_text("pass\n")
    return root


def test_kind_defaults_to_catalog_and_errors_name_fields_without_the_tag() -> None:
    assert type(spec_from_dict(CATALOG)) is JobSpec
    assert type(spec_from_dict({**CATALOG, "kind": "catalog"})) is JobSpec
    assert type(script()) is ScriptJobSpec
    with pytest.raises(ValidationError) as bad_lr:
        spec_from_dict({**CATALOG, "train": {"lr": -1}})
    assert [e["loc"] for e in bad_lr.value.errors()] == [("train", "lr")]
    with pytest.raises(ValidationError) as unknown:
        spec_from_dict({**CATALOG, "kind": "shell"})
    assert [e["loc"] for e in unknown.value.errors()] == [("kind",)]
    with pytest.raises(ValidationError) as mixed:
        spec_from_dict({"kind": "script", "name": "s", "entrypoint": "train.py", "model": {"name": "mlp"}})
    assert [e["loc"] for e in mixed.value.errors()] == [("model",)]
    with pytest.raises(ValidationError) as shell:
        spec_from_dict({"kind": "script", "name": "s", "entrypoint": "train.py", "args": "--lr 1; rm -rf /"})
    assert [e["loc"] for e in shell.value.errors()] == [("args",)]
    # A stored spec round-trips to the same kind, as the worker reads it back.
    assert spec_from_dict(script(args=["1"]).model_dump(mode="json")) == script(args=["1"])


def test_shared_fields_live_on_the_base_once() -> None:
    shared = {"name", "parallel", "max_restarts", "retries", "timeout_s", "stall_timeout_s", "queue", "labels"}
    assert shared <= set(JobSpec.model_fields) & set(ScriptJobSpec.model_fields)
    assert {"model", "data", "train"}.isdisjoint(ScriptJobSpec.model_fields)


def test_entrypoints_resolve_under_the_code_root(code: Path, tmp_path: Path) -> None:
    assert resolve_entrypoint("train.py", code).file == (code / "train.py").resolve()
    assert resolve_entrypoint(str(code / "train.py"), code).file == (code / "train.py").resolve()
    fit = resolve_entrypoint("pkg.sub.fit", code)
    assert (fit.module, fit.file) == ("pkg.sub.fit", (code / "pkg" / "sub" / "fit.py").resolve())
    assert resolve_entrypoint("app", code).file == (code / "app" / "__main__.py").resolve()
    assert resolve_entrypoint("yaml.composer", code).module == "yaml.composer"  # installed, not in the code root

    (tmp_path / "outside.py").write_text("pass\n")
    (tmp_path / "outpkg").mkdir()
    (tmp_path / "outpkg" / "__init__.py").write_text("")
    (code / "link.py").symlink_to(tmp_path / "outside.py")
    (code / "pkg" / "evil.py").symlink_to(tmp_path / "outside.py")
    (code / "lpkg").mkdir()
    (code / "lpkg" / "__init__.py").symlink_to(tmp_path / "outpkg" / "__init__.py")
    (code / "lpkg" / "m.py").write_text("pass\n")
    refused = {
        "../outside.py": "'..'", "pkg/../train.py": "'..'", str(tmp_path / "outside.py"): "outside the code root",
        "link.py": "outside the code root", "pkg.evil": "outside the code root", "lpkg.m": "__init__.py resolves outside",
        "nope.py": "no such file", "pkg.nope": "no module", "os": "standard-library", "torch.utils.bottleneck": "cannot be run",
        "trainer": "cannot be run", "yaml": "without __main__", "pkg/train": "dotted module name",
        "no_such_module_anywhere": "no module", "yaml.nope": "no module",
    }
    for entrypoint, why in refused.items():
        with pytest.raises(ValueError, match=why):
            resolve_entrypoint(entrypoint, code)
    with pytest.raises(ValueError, match="code root"):
        resolve_entrypoint("train.py", None)


def test_checking_a_module_imports_nothing(code: Path) -> None:
    # The API process must not run a package's __init__ just to check an entrypoint; a fresh interpreter shows it.
    probe = ("import sys; from trainer.spec import resolve_entrypoint; resolve_entrypoint('yaml.composer', None); "
             "assert 'yaml' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # A package in the code root with an __init__ that would raise on import is checked without running it.
    (code / "boom").mkdir()
    (code / "boom" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (code / "boom" / "run.py").write_text("pass\n")
    assert resolve_entrypoint("boom.run", code).file == (code / "boom" / "run.py").resolve()


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONBREAKPOINT", "LD_PRELOAD", "LD_LIBRARY_PATH",
                                  "DYLD_INSERT_LIBRARIES", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCHYARD_JOB_ID", "TORCHYARD_ADMIN_TOKEN",
                                  "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                  "CUDA_VISIBLE_DEVICES", "NCCL_NET_PLUGIN", "TORCHINDUCTOR_CACHE_DIR", "PATH", "BASH_ENV", "1BAD", "A-B"])
def test_env_names_that_change_code_loading_are_refused(name: str) -> None:
    assert env_problem(name)


@pytest.mark.parametrize("name", ["WANDB_MODE", "HF_HUB_OFFLINE", "NCCL_DEBUG", "OMP_NUM_THREADS", "PYTHONHASHSEED", "MY_SETTING",
                                  "PYTORCH_CUDA_ALLOC_CONF", "TORCH_DISTRIBUTED_DEBUG"])
def test_ordinary_env_names_are_allowed(name: str) -> None:
    assert env_problem(name) is None


def test_spec_problems_name_each_field(code: Path) -> None:
    limits = SpecLimits(code_dir=code, max_nproc_per_node=2)
    spec = script(entrypoint="../x.py", env={"LD_PRELOAD": "/x.so", "OK": "1", "NUL": "a\x00b"}, args=["ok", "a\x00"],
                  parallel={"nproc_per_node": 4}, labels={"bad key": "v"})
    fields = sorted(p.field for p in spec_problems(spec, limits))
    assert fields == ["args.1", "entrypoint", "env.LD_PRELOAD", "env.NUL", "labels.bad key", "parallel.nproc_per_node"]
    assert spec_problems(script(env={"OK": "1"}), limits) == []
    with pytest.raises(SpecError, match="entrypoint"):
        parse_spec({"kind": "script", "name": "s", "entrypoint": "missing.py"}, limits)
    assert isinstance(parse_spec('{"kind": "script", "name": "s", "entrypoint": "train.py"}', limits), ScriptJobSpec)


def test_torchrun_runs_the_resolved_file_or_module_with_args_verbatim(code: Path, tmp_path: Path) -> None:
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    run_dir = tmp_path / "runs" / "j1"
    cmd = torchrun_command(script(args=["--lr", "0.1; rm -rf /", "$HOME"], parallel={"nproc_per_node": 2}), run_dir, 1, settings)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in cmd and f"--log-dir={run_dir / 'logs' / 'attempt-1'}" in cmd
    assert cmd[-4:] == [str((code / "train.py").resolve()), "--lr", "0.1; rm -rf /", "$HOME"]
    assert torchrun_command(script(entrypoint="pkg.sub.fit", args=["x"]), run_dir, 2, settings)[-3:] == ["-m", "pkg.sub.fit", "x"]
    catalog = torchrun_command(spec_from_dict(CATALOG), run_dir, 1, settings)
    assert catalog[-6:] == ["-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir)]

    # Accepted, then the file was swapped for a symlink out of the code root: the worker refuses to launch it.
    (code / "train.py").unlink()
    (tmp_path / "evil.py").write_text("pass\n")
    (code / "train.py").symlink_to(tmp_path / "evil.py")
    with pytest.raises(SpecError, match="entrypoint"):
        torchrun_command(script(), run_dir, 1, settings)


def test_script_env_has_the_job_env_and_code_root_but_no_service_settings(code: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_ADMIN_TOKEN", "secret")
    monkeypatch.setenv("TORCHYARD_DATABASE_URL", "postgresql://user:pw@db/x")
    monkeypatch.setenv("PYTHONPATH", "/srv/torchyard")
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    run_dir = tmp_path / "runs" / "j1"
    env = torchrun_env("j1", 3, run_dir, settings, script(env={"WANDB_MODE": "offline", "RANK": "7"}), resume_from="/runs/old/a.pt")
    assert "TORCHYARD_ADMIN_TOKEN" not in env and "TORCHYARD_DATABASE_URL" not in env
    assert env["WANDB_MODE"] == "offline"
    assert env.get("RANK") == os.environ.get("RANK")  # refused at launch too, whatever the stored spec says
    assert env["PYTHONPATH"] == f"{code.resolve()}{os.pathsep}/srv/torchyard"
    assert env[RUN_DIR_ENV] == str(run_dir.resolve())
    assert env[RESUME_FROM_ENV] == "/runs/old/a.pt"
    assert (env["TORCHYARD_JOB_ID"], env["TORCHYARD_ATTEMPT"], env["TORCHYARD_CODE_DIR"]) == ("j1", "3", str(code.resolve()))
    # Catalog jobs keep the worker's environment as before (the trainer is torchyard's own code).
    catalog_env = torchrun_env("j2", 1, run_dir, settings, spec_from_dict(CATALOG))
    assert catalog_env["TORCHYARD_ADMIN_TOKEN"] == "secret" and catalog_env["PYTHONPATH"] == "/srv/torchyard"
