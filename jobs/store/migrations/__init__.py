"""Alembic migrations of the torchyard schema. Applied by ``jobs.store.db.init_db`` (the API and the
worker at start) or by hand: ``python -m jobs.store.db upgrade`` / ``alembic upgrade head``."""
