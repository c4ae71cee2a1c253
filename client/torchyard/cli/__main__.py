"""``python -m torchyard.cli``: the same as the ``torchyard`` console script."""

from torchyard.cli.main import app

app(prog_name="torchyard")
