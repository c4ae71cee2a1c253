"""Where the client finds the API URL and key: explicit arguments, then the environment
(``TORCHYARD_URL``, ``TORCHYARD_API_KEY``), then a TOML file, then the local default.

The file is ``$TORCHYARD_CONFIG`` or ``$XDG_CONFIG_HOME/torchyard/config.toml``
(``~/.config/torchyard/config.toml``)::

    url = "http://127.0.0.1:8000"
    api_key = "..."
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser, from PyPI
    import tomli as tomllib

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL, ENV_KEY, ENV_CONFIG = "TORCHYARD_URL", "TORCHYARD_API_KEY", "TORCHYARD_CONFIG"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ClientConfig:
    url: str
    api_key: str | None
    source: str  # where the key came from, for error messages: "argument", "environment", a file path, "none"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]).expanduser() if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "torchyard" / "config.toml"


def read_config_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    unknown = set(data) - {"url", "api_key"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; expected url and api_key")
    return data


def write_config_file(path: Path, url: str, api_key: str) -> None:
    """Replace the file atomically, readable by its owner only (the key is a secret)."""
    import tomli_w  # only `torchyard login` writes; the client library itself only reads

    path.parent.mkdir(parents=True, exist_ok=True)
    # Not trainer.atomic: the client imports nothing of `trainer`, which a user's own trainer.py shadows.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        tomli_w.dump({"url": url, "api_key": api_key}, f)
    os.replace(tmp, path)


def load_config(url: str | None = None, api_key: str | None = None, path: Path | None = None,
                env: Mapping[str, str] | None = None) -> ClientConfig:
    """Resolve each of url and key on its own, so a file can hold the URL while the key comes from the environment."""
    env = os.environ if env is None else env
    file_path = path or config_path(env)
    file = read_config_file(file_path)
    key, source = api_key, "argument"
    if not key and env.get(ENV_KEY):
        key, source = env[ENV_KEY], "environment"
    if not key and file.get("api_key"):
        key, source = str(file["api_key"]), str(file_path)
    if not key:
        source = "none"
    resolved_url = url or env.get(ENV_URL) or file.get("url") or DEFAULT_URL
    return ClientConfig(url=str(resolved_url).rstrip("/"), api_key=key, source=source)
