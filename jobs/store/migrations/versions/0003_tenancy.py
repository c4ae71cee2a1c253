"""Tenancy: job secrets in a table of their own (encrypted), and per-key queue allow-lists.

Revision ID: 0003_tenancy
Revises: 0002_executor_id
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_tenancy"
down_revision: str | None = "0002_executor_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_secrets",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("names", sa.JSON(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("job_id"),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("queues", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("queues")
    op.drop_table("job_secrets")
