"""What the CLI tells a user, against a real API (no worker; what a worker would record is written directly):
where a refused key came from, a script job's status and download, pruned checkpoints, units of system
metrics, and a cancelled job's launcher log."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from jobs.store.ingest_found import FoundCheckpoint, ingest_found, last_found_seq
from jobs.store.states import Status
from tests.api.conftest import finish_job, ingest, session_of, start_job
from tests.cli.conftest import cli
from tests.helpers import Services
from torchyard.cli.main import app
from torchyard.client.config import load_config, write_config_file

DATA = Path(__file__).parent / "data"

BAD = "tyk_not-a-key"


def test_a_refused_key_says_where_it_came_from(services: Services, tmp_path: Path) -> None:
    services.start_api()
    config = tmp_path / "config.toml"
    write_config_file(config, services.url, BAD)
    runner = CliRunner()

    from_env = runner.invoke(app, ["ls"], env={"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": BAD, "TORCHYARD_CONFIG": str(config)})
    assert from_env.exit_code == 4
    assert "the refused key came from the environment variable TORCHYARD_API_KEY" in from_env.output, from_env.output

    from_option = runner.invoke(app, ["--key", BAD, "ls"], env={"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": None,
                                                                 "TORCHYARD_CONFIG": str(config)})
    assert from_option.exit_code == 4 and "the key passed with --key was refused" in from_option.output, from_option.output

    from_file = runner.invoke(app, ["ls"], env={"TORCHYARD_URL": None, "TORCHYARD_API_KEY": None, "TORCHYARD_CONFIG": str(config)})
    assert from_file.exit_code == 4
    assert f"the refused key came from {config}; `torchyard login` replaces it" in " ".join(from_file.output.split()), from_file.output

    no_key = runner.invoke(app, ["ls"], env={"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": None,
                                             "TORCHYARD_CONFIG": str(tmp_path / "none.toml")})
    assert no_key.exit_code == 4 and "no API key was given" in no_key.output, no_key.output


def test_the_config_file_keeps_any_key_and_url_and_is_owner_only(tmp_path: Path) -> None:
    config = tmp_path / "dir" / "config.toml"
    key = 'a"quote\\back\tslash \u00e9 \U0001f600'
    write_config_file(config, "http://h:1/x?a=\"b\"", key)
    cfg = load_config(path=config, env={})
    assert (cfg.url, cfg.api_key, cfg.source) == ('http://h:1/x?a="b"', key, str(config))
    assert config.stat().st_mode & 0o777 == 0o600


def _checkpoint(run_dir: Path, seq: int, step: int, keep: bool) -> dict:
    path = f"ckpt/step-{step}.pt"
    if keep:
        (run_dir / "ckpt").mkdir(exist_ok=True)
        (run_dir / path).write_bytes(b"w" * 100)
    return {"seq": seq, "time": 1_700_000_000.0 + seq, "type": "checkpoint", "step": step, "path": path}


def test_a_finished_script_job_in_status_and_download(services: Services) -> None:
    services.start_api()
    (services.settings.code_dir / "train.py").write_text("print('hi')\n")
    with services.client() as client:
        resp = client.post("/v1/jobs", json={"kind": "script", "name": "mine", "entrypoint": "train.py",
                                             "args": ["--epochs", "3", "--note", "two words"], "parallel": {"nproc_per_node": 2}})
        assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    run_dir = start_job(services.settings, job_id)
    # keep_last 2 of 5: the three oldest were deleted from disk.
    events = [_checkpoint(run_dir, i + 1, step, keep=step > 30) for i, step in enumerate((10, 20, 30, 40, 50))]
    events.append({"seq": 6, "time": 1_700_000_006.0, "type": "metric", "step": 50,
                   "values": {"sys/rss_bytes": 353_100_000.0, "sys/cpu_percent": 97.25, "train/loss": 0.5}})
    ingest(services.settings, job_id, events)
    finish_job(services.settings, job_id)

    code, out = cli(services, "status", job_id)
    said = " ".join(out.replace("│", " ").split())  # the panel wraps long lines
    assert code == 0, out
    assert "script train.py --epochs 3 --note 'two words', x 2" in said, out
    assert f"checkpoints: 2, latest step 50: {run_dir}/ckpt/step-50.pt (3 older pruned by keep_last)" in said, out
    assert "336.7 MiB" in out and "97.2%" in out and "3.531e+08" not in out, out

    code, out = cli(services, "metrics", job_id, "--name", "sys/rss_bytes")
    assert code == 0 and "336.7 MiB" in out, out

    code, out = cli(services, "download", job_id)
    said = " ".join(out.replace("│", " ").split())  # the panel wraps long lines
    assert code == 4, out
    assert f"job {job_id} is a script job: its checkpoints hold what its script saved" in said, out
    assert f"step 50 is {run_dir}/ckpt/step-50.pt on the runs volume" in said and "the final checkpoint of a finished job" not in said

    code, out = cli(services, "retry", job_id)  # a retry says where it starts
    assert code == 0 and f"retried {job_id} as" in out and "from its checkpoint at step 50" in " ".join(out.split()), out


def test_download_of_a_script_job_with_a_trainer_checkpoint_points_to_its_step(services: Services, tmp_path: Path) -> None:
    services.start_api()
    (services.settings.code_dir / "train.py").write_text("print('hi')\n")
    with services.client() as client:
        resp = client.post("/v1/jobs", json={"kind": "script", "name": "hf", "entrypoint": "train.py"})
        assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    run_dir = start_job(services.settings, job_id)
    saved = run_dir / "workdir" / "out" / "checkpoint-30"
    saved.mkdir(parents=True)
    (saved / "trainer_state.json").write_text("{}")
    with session_of(services.settings) as s:
        found = FoundCheckpoint(30, "workdir/out/checkpoint-30", 1_700_000_000.0, {"found": "huggingface", "step_known": True})
        ingest_found(s, job_id, last_found_seq(s, job_id), [], [found])
    finish_job(services.settings, job_id)

    code, out = cli(services, "download", job_id)
    said = " ".join(out.replace("│", " ").split())
    assert code == 4 and f"`torchyard download {job_id} --step 30` downloads that directory as one tar" in said, out
    code, out = cli(services, "download", job_id, "--step", "30", "-o", str(tmp_path / "c.tar"))
    assert code == 0 and (tmp_path / "c.tar").stat().st_size > 0, out


def test_the_launcher_log_of_a_cancelled_job_folds_the_expected_traceback(services: Services) -> None:
    services.start_api()
    from tests.api.conftest import mlp_spec

    with services.client() as client:
        job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    run_dir = start_job(services.settings, job_id)
    (run_dir / "logs" / "attempt-1").mkdir(parents=True)
    (run_dir / "logs" / "attempt-1" / "launcher.log").write_text((DATA / "launcher-sigterm.log").read_text())

    code, running = cli(services, "logs", job_id, "--rank", "launcher")
    assert code == 0 and "SignalException: Process 1586 got signal: 15" in running  # not stopped by the service: as written

    finish_job(services.settings, job_id, Status.CANCELLED, reason="cancelled by admin")
    code, out = cli(services, "logs", job_id, "--rank", "launcher")
    assert code == 0, out
    assert "Traceback" not in out and "got signal: 15" not in out and "_terminate_process_handler" not in out, out
    assert "Received 15 death signal, shutting down workers" in out  # torchrun's own lines stay
    assert ("[torchyard] torchrun stopped by SIGTERM because the job was cancelled; the SignalException traceback "
            "it prints then is expected and folded here") in out
