"""Host states on real processes, with the priority tests' settings: SQLite and a short stop grace, so jobs a drain
stops leave soon."""

from tests.priority.conftest import database_url, settings  # noqa: F401 - the fixtures, shared

__all__ = ["database_url", "settings"]
