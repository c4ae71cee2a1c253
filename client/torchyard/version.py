"""torchyard's version: the one source for both distributions (client/pyproject.toml and the service's
pyproject.toml read it here), the CLI's --version, the client's user agent and the API."""

VERSION = "0.1.0"
