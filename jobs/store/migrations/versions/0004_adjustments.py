"""adjustments on jobs: what the service changed in a job's spec between attempts (OOM recovery).

Revision ID: 0004_adjustments
Revises: 0003_tenancy
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_adjustments"
down_revision: str | None = "0003_tenancy"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch_alter_table: SQLite cannot ALTER most things in place; on PostgreSQL this is a plain ALTER.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("adjustments", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("adjustments")
