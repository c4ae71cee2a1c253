"""Priority, quotas and preemption on real processes: the chaos tests' short leases and stop grace."""

from tests.chaos.conftest import database_url, settings  # noqa: F401 - fixtures
