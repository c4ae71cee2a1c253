"""A counter row per owner for the queued-job cap (jobs.store.limits): a submission takes a slot with one conditional
UPDATE instead of counting the owner's queued jobs under a per-owner lock.

Backfilled from the jobs table: every owner that has jobs gets a row with its jobs in ``queued`` now. Stop
the API and the workers of the previous version first: their submissions and status changes do not move the
counters, and a counter that missed them stays off until this migration runs again from 0005.

Revision ID: 0006_owner_counters
Revises: 0005_read_indexes
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_owner_counters"
down_revision: str | None = "0005_read_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "owner_counters",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )
    op.execute(
        "INSERT INTO owner_counters (owner, queued) "
        "SELECT owner, SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) FROM jobs GROUP BY owner"
    )


def downgrade() -> None:
    op.drop_table("owner_counters")
