"""Hosts and placements: the hosts workers register (their GPUs and CPU slots), where each job's attempt
runs, the scheduler's stored waiting reason and position of a queued job, and the named leases (the
scheduler's leader).

Revision ID: 0008_hosts_and_placements
Revises: 0007_job_uids
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_hosts_and_placements"
down_revision: str | None = "0007_job_uids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("cpu_slots", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("executor", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=True),
        sa.Column("last_seen", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_hosts_last_seen", "hosts", ["last_seen"], unique=False)
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    # batch_alter_table: SQLite cannot ALTER most things in place; on PostgreSQL this is a plain ALTER.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("queue_position", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("waiting_reason", sa.Text(), nullable=True))
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("placement")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("waiting_reason")
        batch.drop_column("queue_position")
        batch.drop_column("placement")
    op.drop_table("leases")
    op.drop_index("ix_hosts_last_seen", table_name="hosts")
    op.drop_table("hosts")
