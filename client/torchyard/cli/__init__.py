"""The ``torchyard`` command line (Typer + Rich), built on the ``client`` package."""
