"""The uid each running attempt holds (worker/sandbox/job_users.py): one row per uid in use, across every worker.

Revision ID: 0007_job_uids
Revises: 0006_owner_counters
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_job_uids"
down_revision: str | None = "0006_owner_counters"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_uids",
        sa.Column("uid", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=False),
        sa.Column("acquired_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("uid"),
    )
    op.create_index("ix_job_uids_job_id", "job_uids", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_uids_job_id", table_name="job_uids")
    op.drop_table("job_uids")
