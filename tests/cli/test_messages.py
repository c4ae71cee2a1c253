"""What the CLI tells a user, against a real API (no worker): where a refused key came from."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from client.config import load_config, write_config_file
from tests.helpers import Services

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
