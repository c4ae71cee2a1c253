"""Script specs without services: the kind union, entrypoint resolution against the code root and the
operator's module allow-list, the env allow-list, and the torchrun command and environment the worker
builds from them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from jobs.settings import Settings
from jobspec.env_rules import env_name_problem, name_problem
from jobspec.spec import (
    JobSpec,
    ScriptJobSpec,
    SpecError,
    SpecLimits,
    parse_spec,
    resolve_entrypoint,
    spec_from_dict,
    spec_problems,
)
from jobspec.torchrun_args import verbatim
from tests.helpers import ROOT
from worker import venvs
from worker.launch import BOOTSTRAP, RESUME_FROM_ENV, RUN_DIR_ENV, torchrun_command, torchrun_env, trainer_main

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
    shared = {"name", "parallel", "max_restarts", "retries", "timeout_s", "stall_timeout_s", "queue", "labels", "env", "secrets"}
    assert shared <= set(JobSpec.model_fields) & set(ScriptJobSpec.model_fields)
    assert {"model", "data", "train"}.isdisjoint(ScriptJobSpec.model_fields)


def test_entrypoints_resolve_under_the_code_root(code: Path, tmp_path: Path) -> None:
    assert resolve_entrypoint("train.py", code).file == (code / "train.py").resolve()
    assert resolve_entrypoint(str(code / "train.py"), code).file == (code / "train.py").resolve()
    fit = resolve_entrypoint("pkg.sub.fit", code)
    assert (fit.module, fit.file) == ("pkg.sub.fit", (code / "pkg" / "sub" / "fit.py").resolve())
    assert resolve_entrypoint("app", code).file == (code / "app" / "__main__.py").resolve()
    # An installed module runs only when the operator lists it, by its exact name.
    listed = frozenset({"yaml.composer"})
    assert resolve_entrypoint("yaml.composer", code, listed) == resolve_entrypoint("yaml.composer", None, listed)
    assert resolve_entrypoint("yaml.composer", code, listed).module == "yaml.composer"

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
        "nope.py": "no such file", "pkg.nope": "no module", "pkg/train": "dotted module name",
    }
    # Installed modules the operator did not list, whatever they are: launchers, the standard library, torchyard.
    for module in ("os", "runpy", "dotenv", "pygments", "rich.syntax", "watchfiles", "typer", "mako.cmd", "alembic", "pip",
                   "torch.utils.bottleneck", "trainer", "yaml", "yaml.nope", "no_such_module_anywhere"):
        refused[module] = "TORCHYARD_SCRIPT_MODULES"
    for entrypoint, why in refused.items():
        with pytest.raises(ValueError, match=why):
            resolve_entrypoint(entrypoint, code, frozenset({"yaml.composer"}))
    with pytest.raises(ValueError, match="code root"):
        resolve_entrypoint("train.py", None)


def test_checking_a_module_imports_nothing(code: Path) -> None:
    # The API process must not run a package's __init__ just to check an entrypoint; a fresh interpreter shows it.
    probe = ("import sys; from jobspec.spec import resolve_entrypoint; resolve_entrypoint('yaml.composer', None, {'yaml.composer'}); "
             "assert 'yaml' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # A package in the code root with an __init__ that would raise on import is checked without running it.
    (code / "boom").mkdir()
    (code / "boom" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (code / "boom" / "run.py").write_text("pass\n")
    assert resolve_entrypoint("boom.run", code).file == (code / "boom" / "run.py").resolve()


# The list (each makes torch, NCCL, UCX or Python write or load a file of the caller's choosing), the loader and
# interpreter hooks, torchrun's and torchyard's own variables, and names on no allow-list at all.
@pytest.mark.parametrize("name", [
    "NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_TOPO_FILE", "NCCL_NET_PLUGIN", "NCCL_CONF_FILE", "TORCH_LOGS_OUT", "TORCH_TRACE",
    "TMPDIR", "TORCH_COMPILE_DEBUG_DIR", "PYTORCH_KERNEL_CACHE_PATH", "UCX_MODULE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME",
    "TORCH_EXTENSIONS_DIR", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONBREAKPOINT",
    "PYTHONWARNINGS", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "PATH", "HOME", "BASH_ENV",
    "TORCHYARD_JOB_ID", "TORCHYARD_ADMIN_TOKEN", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "WANDB_DIR", "WANDB_CACHE_DIR", "HF_HOME", "HF_DATASETS_CACHE", "HF_TOKEN_PATH",
    "TRANSFORMERS_CACHE", "APP_OUTPUT_DIR", "MY_SETTING", "1BAD", "A-B",
])
def test_env_names_outside_the_allow_list_are_refused(name: str) -> None:
    assert env_name_problem(name)
    assert name_problem(name)  # secrets follow the same name rules


@pytest.mark.parametrize("name", ["WANDB_MODE", "WANDB_PROJECT", "HF_HUB_OFFLINE", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                  "PYTHONHASHSEED", "APP_SETTING", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_DISTRIBUTED_DEBUG",
                                  "CUDA_LAUNCH_BLOCKING"])
def test_allowed_env_names(name: str) -> None:
    assert env_name_problem(name) is None


def test_unpickling_by_default_is_refused_saying_what_to_do_instead() -> None:
    # Scripts written for torch < 2.6 torch.load pickles (numpy arrays, argparse.Namespace) and fail under the workers'
    # torch; the switch that would load them everywhere would also let a job's file run code in an operator's module.
    assert "weights_only=False" in (env_name_problem("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") or "")


def test_credentials_belong_in_secrets_not_env() -> None:
    for name in ("WANDB_API_KEY", "HF_TOKEN", "APP_DB_PASSWORD"):
        assert "secrets" in (env_name_problem(name) or "")
        assert name_problem(name) is None


def test_spec_problems_name_each_field(code: Path) -> None:
    limits = SpecLimits(code_dir=code, max_nproc_per_node=2)
    spec = script(entrypoint="../x.py", env={"LD_PRELOAD": "/x.so", "APP_OK": "1", "APP_NUL": "a\x00b"}, args=["ok", "a\x00"],
                  parallel={"nproc_per_node": 4}, labels={"bad key": "v"}, secrets={"TMPDIR": "/x", "HF_TOKEN": "t"})
    fields = sorted(p.field for p in spec_problems(spec, limits))
    assert fields == ["args.1", "entrypoint", "env.APP_NUL", "env.LD_PRELOAD", "labels.bad key", "parallel.nproc_per_node",
                      "secrets.TMPDIR"]
    assert spec_problems(script(env={"APP_OK": "1"}), limits) == []
    # Totals are capped, each naming its field; no message quotes a secret's value.
    big = script(args=["x" * 4000] * 20, env={f"APP_{i}": "v" * 4000 for i in range(10)}, secrets={"HF_TOKEN": "s" * 8000} | {
        f"APP_S{i}": "s" * 8000 for i in range(8)})
    problems = spec_problems(big, limits)
    assert sorted(p.field for p in problems) == ["args", "env", "secrets"]
    assert all("sss" not in p.msg for p in problems)
    assert [p.field for p in spec_problems(script(secrets={"HF_TOKEN": "t"}), SpecLimits(code_dir=code, secrets_allowed=False))] == [
        "secrets"]
    assert [p.field for p in spec_problems(script(queue="gpu"), SpecLimits(code_dir=code, queues=frozenset({"default"})))] == ["queue"]
    with pytest.raises(SpecError, match="entrypoint"):
        parse_spec({"kind": "script", "name": "s", "entrypoint": "missing.py"}, limits)
    assert isinstance(parse_spec('{"kind": "script", "name": "s", "entrypoint": "train.py"}', limits), ScriptJobSpec)


def test_torchrun_runs_the_resolved_file_or_module_with_args_verbatim(code: Path, tmp_path: Path) -> None:
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    run_dir = tmp_path / "runs" / "j1"
    cmd = torchrun_command(script(args=["--lr", "0.1; rm -rf /", "$HOME"], parallel={"nproc_per_node": 2}), run_dir, 1, settings)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in cmd and f"--log-dir={run_dir / 'logs' / 'attempt-1'}" in cmd
    root = str(code.resolve())
    # Every script rank starts in the bootstrap (output as printed, parent-death signal, code root on sys.path).
    # "$" is doubled for torchrun, which renders each rank's arguments as a template (test_args_reach_the_rank_...).
    assert cmd[-8:] == ["-m", BOOTSTRAP, root, "file", str((code / "train.py").resolve()), "--lr", "0.1; rm -rf /", "$$HOME"]
    assert torchrun_command(script(entrypoint="pkg.sub.fit", args=["x"]), run_dir, 2, settings)[-7:] == [
        "-m", BOOTSTRAP, root, "module", "pkg.sub.fit", str((code / "pkg" / "sub" / "fit.py").resolve()), "x"]
    # An installed module the operator listed has no file under the code root; the bootstrap is told which kind it is.
    listed = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs", script_modules=["json.tool"])
    assert torchrun_command(script(entrypoint="json.tool", args=["x"]), run_dir, 1, listed)[-6:] == [
        "-m", BOOTSTRAP, root, "installed", "json.tool", "x"]
    # A job with an uploaded bundle resolves inside the run directory's unpacked copy, never the code root,
    # and that copy is the code root its ranks are given.
    bundled = script(code="sha256:" + "a" * 64)
    with pytest.raises(SpecError, match="entrypoint"):
        torchrun_command(bundled, run_dir, 1, settings)
    (run_dir / "code").mkdir(parents=True)
    (run_dir / "code" / "train.py").write_text("pass\n")
    bundle_root = str((run_dir / "code").resolve())
    assert torchrun_command(bundled, run_dir, 1, settings)[-5:] == [
        "-m", BOOTSTRAP, bundle_root, "file", str((run_dir / "code" / "train.py").resolve())]
    assert torchrun_env("j1", 1, run_dir, settings, bundled)["TORCHYARD_CODE_DIR"] == bundle_root
    # A catalog job's ranks are forked from torchrun, from the trainer of the worker's own installation; or started
    # as interpreters of their own where the operator says so.
    catalog = torchrun_command(spec_from_dict(CATALOG), run_dir, 1, settings)
    main_file = Path(trainer_main())
    assert main_file == (ROOT / "trainer" / "__main__.py").resolve() and main_file.is_file()
    assert catalog[-7:] == ["--run-path", "--start-method=fork", str(main_file), "--spec", str(run_dir / "spec.json"),
                            "--run-dir", str(run_dir)]
    fresh = torchrun_command(spec_from_dict(CATALOG), run_dir, 1, settings.model_copy(update={"fork_ranks": False}))
    assert fresh[-6:] == ["-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir)]

    # Accepted, then the file was swapped for a symlink out of the code root: the worker refuses to launch it.
    (code / "train.py").unlink()
    (tmp_path / "evil.py").write_text("pass\n")
    (code / "train.py").symlink_to(tmp_path / "evil.py")
    with pytest.raises(SpecError, match="entrypoint"):
        torchrun_command(script(), run_dir, 1, settings)


@given(st.lists(st.text(alphabet="$lo{}_ca-rnk1", max_size=24) | st.sampled_from(["${local_rank}", "$local_rank", "$$", "$"]),
                max_size=4))
def test_args_reach_the_rank_verbatim_but_for_local_rank(args: list[str]) -> None:
    """Through torchrun's own per-rank substitution (what its agent does to every rank's arguments): each argument
    arrives as written, with ``${local_rank}`` alone replaced by the rank's local rank."""
    from torch.distributed.elastic.utils.api import macros

    assert macros.substitute([verbatim(a) for a in args], "3") == [a.replace("${local_rank}", "3") for a in args]


def test_rank_env_has_the_job_env_and_secrets_but_no_service_settings(code: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_ADMIN_TOKEN", "secret")
    monkeypatch.setenv("TORCHYARD_DATABASE_URL", "postgresql://user:pw@db/x")
    monkeypatch.setenv("TORCHYARD_SECRETS_KEY", Fernet.generate_key().decode())
    monkeypatch.setenv("TORCHYARD_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("PYTHONPATH", "/srv/torchyard")
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    run_dir = tmp_path / "runs" / "j1"
    spec = script(env={"WANDB_MODE": "offline", "RANK": "7", "NCCL_DEBUG_FILE": "/tmp/x"})
    env = torchrun_env("j1", 3, run_dir, settings, spec, resume_from="/runs/old/a.pt",
                       secrets={"HF_TOKEN": "hf_x", "LD_PRELOAD": "/evil.so"})
    assert not {"TORCHYARD_ADMIN_TOKEN", "TORCHYARD_DATABASE_URL", "TORCHYARD_SECRETS_KEY"} & set(env)
    assert env["TORCHYARD_LOG_LEVEL"] == "DEBUG"  # configures the trainer, not the service
    assert (env["WANDB_MODE"], env["HF_TOKEN"]) == ("offline", "hf_x")
    # Refused at launch too, whatever the stored spec or secrets say.
    assert env.get("RANK") == os.environ.get("RANK") and "NCCL_DEBUG_FILE" not in env
    assert env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD")
    assert env["PYTHONSAFEPATH"] == "1" and env["PYTHONPATH"] == "/srv/torchyard"  # the bootstrap adds the code root
    assert env[RUN_DIR_ENV] == str(run_dir.resolve())
    assert env[RESUME_FROM_ENV] == "/runs/old/a.pt"
    assert (env["TORCHYARD_JOB_ID"], env["TORCHYARD_ATTEMPT"], env["TORCHYARD_CODE_DIR"]) == ("j1", "3", str(code.resolve()))
    # Catalog jobs: the same rules; their env reaches the ranks too (TORCH_DISTRIBUTED_DEBUG on a hanging job).
    catalog = spec_from_dict({**CATALOG, "env": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}})
    catalog_env = torchrun_env("j2", 1, run_dir, settings, catalog)
    assert "TORCHYARD_ADMIN_TOKEN" not in catalog_env and catalog_env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert catalog_env["PYTHONSAFEPATH"] == "1"


def test_a_script_given_no_wandb_key_runs_wandb_offline(code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    run_dir = tmp_path / "runs" / "j1"
    assert torchrun_env("j1", 1, run_dir, settings, script())["WANDB_MODE"] == "offline"
    # A key in the job's secrets, a mode of its own, or a key the operator gave the workers: wandb runs as they say.
    assert "WANDB_MODE" not in torchrun_env("j1", 1, run_dir, settings, script(), secrets={"WANDB_API_KEY": "k"})
    assert torchrun_env("j1", 1, run_dir, settings, script(env={"WANDB_MODE": "online"}))["WANDB_MODE"] == "online"
    monkeypatch.setenv("WANDB_API_KEY", "operator's")
    assert "WANDB_MODE" not in torchrun_env("j1", 1, run_dir, settings, script())


def test_a_job_with_requirements_runs_in_its_environment_whatever_its_env_says(code: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs")
    requirements = ["tomli-w==1.2.0"]
    venv = settings.venvs_root / venvs.env_key(settings, requirements)  # as venvs.ensure leaves a built one
    (venv / "bin").mkdir(parents=True)
    (venv / venvs.READY).write_text("{}")
    # Accepted by the schema alone; the allow-list refuses both names at submission and again here, at launch.
    spec = script(requirements=requirements, env={"VIRTUAL_ENV": "/tmp/evil", "PATH": "/tmp/evil", "APP_MODE": "x"})
    run_dir = tmp_path / "runs" / "j1"
    assert torchrun_command(spec, run_dir, 1, settings)[0] == str(venv.resolve() / "bin" / "python")
    env = torchrun_env("j1", 1, run_dir, settings, spec)
    assert env["VIRTUAL_ENV"] == str(venv.resolve()) and env["PATH"] == f"{venv.resolve() / 'bin'}:/usr/bin:/bin"
    assert env["APP_MODE"] == "x"


def test_bootstrap_runs_the_entrypoint_with_siblings_importable_and_the_run_dir_off_sys_path(code: Path, tmp_path: Path) -> None:
    (code / "helper.py").write_text("VALUE = 'sibling'\n")
    (code / "sub").mkdir()
    (code / "sub" / "near.py").write_text("NEAR = 'near'\n")
    report = ("import json, os, sys, ctypes\n"
              "import helper, near\n"
              "libc = ctypes.CDLL('libc.so.6'); sig = ctypes.c_int(0); libc.prctl(2, ctypes.byref(sig), 0, 0, 0)\n"
              "json.dump({'argv': sys.argv, 'helper': helper.VALUE, 'near': near.NEAR, 'cwd_on_path': os.getcwd() in sys.path,"
              " 'pdeathsig': sig.value, 'pythonpath': os.environ['PYTHONPATH'], 'name': __name__},"
              " open(os.environ['OUT'], 'w'))\n")
    (code / "sub" / "train.py").write_text(report)
    (code / "pkg" / "sub" / "fit.py").write_text(report.replace("import helper, near", "import helper; near = helper; helper.NEAR = 'n'"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "helper.py").write_text("VALUE = 'from the run directory'\n")  # must never be imported
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1"}
    fit = str(code / "pkg" / "sub" / "fit.py")
    for kind, target, args in (("file", [str(code / "sub" / "train.py")], ["--a", "1"]), ("module", ["pkg.sub.fit", fit], ["x"])):
        out = tmp_path / f"{kind}.json"
        subprocess.run([sys.executable, "-m", BOOTSTRAP, str(code), kind, *target, *args], cwd=run_dir, check=True,
                       env={**env, "OUT": str(out)})
        seen = json.loads(out.read_text())
        assert seen["helper"] == "sibling" and not seen["cwd_on_path"], seen
        assert seen["pdeathsig"] == signal.SIGKILL and seen["name"] == "__main__"
        assert seen["argv"][1:] == args and seen["argv"][0].endswith(".py")
        assert seen["pythonpath"].split(os.pathsep)[0] == str(code)


def rank_program(spec: ScriptJobSpec, settings: Settings, run_dir: Path) -> list[str]:
    """What torchrun starts on every rank for this spec: its command line from the bootstrap on."""
    cmd = torchrun_command(spec, run_dir, 1, settings)
    return cmd[cmd.index(BOOTSTRAP) - 1:]


def run_program(program: list[str], run_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A rank's command line as torchrun would start it (minus torchrun), in its run directory."""
    return subprocess.run([sys.executable, *program], cwd=run_dir, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1", **env})


def test_a_bundle_cannot_make_the_bootstrap_run_torchyards_modules_on_its_args(tmp_path: Path) -> None:
    """A bundle with its own trainer/rank_bootstrap.py, run as that module with a nested bootstrap's args: before,
    the rank ran the installed bootstrap on them (and so `dotenv run -- sh -c id`); now it runs the bundle's file."""
    code, run_dir = tmp_path / "code", tmp_path / "run"
    (code / "trainer").mkdir(parents=True)
    run_dir.mkdir()
    (code / "trainer" / "__init__.py").write_text("")
    (code / "trainer" / "rank_bootstrap.py").write_text(
        "import sys\nprint('bundle file ran with', sys.argv[1:])\n")
    args = ["/x", "module", "dotenv", "--file", "/etc/hostname", "run", "--", "sh", "-c", "id"]
    program = rank_program(script(entrypoint="trainer.rank_bootstrap", args=args),
                           Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path), run_dir)
    assert program[:6] == ["-m", BOOTSTRAP, str(code.resolve()), "module", "trainer.rank_bootstrap",
                           str((code / "trainer" / "rank_bootstrap.py").resolve())]
    done = run_program(program, run_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"bundle file ran with {args}\n" and "uid=" not in done.stdout + done.stderr

    # The worker resolved one file and the module resolves to another here: the rank refuses to run either.
    (code / "other.py").write_text("print('other ran')\n")
    mismatched = program[:5] + [str(code / "other.py"), *args]
    refused = run_program(mismatched, run_dir)
    assert refused.returncode != 0 and "not running it" in refused.stderr
    assert "ran" not in refused.stdout and "uid=" not in refused.stdout
    # Nor does a module the interpreter has built in (never a file of the code root), whatever the worker says.
    (code / "posix.py").write_text("print('posix ran')\n")
    builtin = run_program(["-m", BOOTSTRAP, str(code), "module", "posix", str(code / "posix.py")], run_dir)
    assert builtin.returncode != 0 and "resolves to nothing" in builtin.stderr and "ran" not in builtin.stdout


def test_a_users_own_trainer_module_is_the_one_its_code_imports(tmp_path: Path) -> None:
    """Repositories often have a trainer.py: the script imports it, not torchyard's trainer package the bootstrap
    loaded for itself; and a `trainer/` package of the user's runs as a module. The SDK still imports without one."""
    code, run_dir = tmp_path / "code", tmp_path / "run"
    code.mkdir()
    run_dir.mkdir()
    (code / "trainer.py").write_text("class Trainer:\n    def fit(self) -> str:\n        return 'fitted by the user'\n")
    (code / "train.py").write_text("import sys\nfrom trainer import Trainer\nprint(Trainer().fit(), sys.argv[1:])\n")
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path)
    done = run_program(rank_program(script(entrypoint="train.py", args=["a"]), settings, run_dir), run_dir)
    assert (done.returncode, done.stdout) == (0, "fitted by the user ['a']\n"), done.stderr

    pkg = tmp_path / "pkgcode"
    (pkg / "trainer").mkdir(parents=True)
    (pkg / "trainer" / "__init__.py").write_text("NAME = 'the user package'\n")
    (pkg / "trainer" / "__main__.py").write_text("import trainer\nprint(trainer.NAME)\n")
    settings = Settings(code_dir=pkg, data_dir=tmp_path / "data", runs_dir=tmp_path)
    program = rank_program(script(entrypoint="trainer"), settings, run_dir)
    assert program[3:] == ["module", "trainer", str((pkg / "trainer" / "__main__.py").resolve())]
    done = run_program(program, run_dir)
    assert (done.returncode, done.stdout) == (0, "the user package\n"), done.stderr

    (code / "trainer.py").unlink()
    (code / "train.py").write_text(f"from trainer import report\nprint(report.__name__, report.__file__.startswith({str(code)!r}))\n")
    done = run_program(rank_program(script(), settings.model_copy(update={"code_dir": code}), run_dir), run_dir)
    assert (done.returncode, done.stdout) == (0, "torchyard.report False\n"), done.stderr


def test_an_allow_listed_installed_module_runs_as_python_m_would(tmp_path: Path) -> None:
    code, run_dir = tmp_path / "code", tmp_path / "run"
    code.mkdir()
    run_dir.mkdir()
    (run_dir / "in.json").write_text('{"b": 1, "a": [2]}')
    settings = Settings(code_dir=code, data_dir=tmp_path / "data", runs_dir=tmp_path, script_modules=["json.tool"])
    program = rank_program(script(entrypoint="json.tool", args=["--sort-keys", "--compact", "in.json"]), settings, run_dir)
    assert program[3:5] == ["installed", "json.tool"]
    done = run_program(program, run_dir)
    assert (done.returncode, done.stdout) == (0, '{"a":[2],"b":1}\n'), done.stderr
