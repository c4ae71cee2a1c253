"""The plumbing under the job domain: logging (``logconfig``), the database's clock (``clock``), tenant API keys
(``keys``), job secrets encrypted at rest (``secrets``), retries through a database or Redis blip (``transient``),
forking safely beside SQLite (``fork_guard``) and the Redis connection (``queue``). The settings they read are
jobs/settings.py."""
