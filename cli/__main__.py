"""``python -m cli``: the same as the ``torchyard`` console script."""

from cli.main import app

app(prog_name="torchyard")
