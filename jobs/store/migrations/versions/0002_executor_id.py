"""executor_id on jobs and attempts: what the executor calls an attempt (the Slurm job id).

Revision ID: 0002_executor_id
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_executor_id"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch_alter_table: SQLite cannot ALTER most things in place; on PostgreSQL these are plain ALTERs.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("executor_id", sa.String(length=64), nullable=True))
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("executor_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("executor_id")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("executor_id")
