"""The torchyard web dashboard: static files served by the API at ``/``; see routes.mount."""

from dashboard.routes import mount

__all__ = ["mount"]
