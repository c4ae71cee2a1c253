"""Alembic migrations of the torchyard schema. Applied by ``jobs.db.init_db`` (the API and the
worker at start) or by hand: ``python -m jobs.db upgrade`` / ``alembic upgrade head``."""
