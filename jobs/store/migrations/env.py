"""Alembic environment. ``jobs.store.db.migrate`` passes an open connection in ``config.attributes``;
the ``alembic`` command line gets its URL from the TORCHYARD_* settings instead."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from sqlmodel import SQLModel

from jobs.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from jobs.webhooks import models as webhook_models  # noqa: F401

config = context.config
target_metadata = SQLModel.metadata


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from logging.config import fileConfig

    from jobs.settings import get_settings
    from jobs.store.db import make_engine

    if config.config_file_name:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
