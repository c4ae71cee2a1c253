"""Priority, quotas and preemption: a job's priority and whether it may be preempted, a stop the
scheduler asks of a running job (it checkpoints and goes back in line), a hold that keeps a queued
job out of placement, per-owner quotas, and what a key may ask for.

Revision ID: 0009_priority_and_quotas
Revises: 0008_hosts_and_placements
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_priority_and_quotas"
down_revision: str | None = "0008_hosts_and_placements"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("cpu_slots", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("owner"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="50"))
        batch.add_column(sa.Column("preemptible", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("borrowed", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("stop_request", sa.Text(), nullable=True))
        batch.add_column(sa.Column("hold", sa.Text(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("max_priority", sa.Integer(), nullable=False, server_default="50"))
        batch.add_column(sa.Column("may_protect", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("may_protect")
        batch.drop_column("max_priority")
    with op.batch_alter_table("jobs") as batch:
        for column in ("hold", "stop_request", "borrowed", "preemptible", "priority"):
            batch.drop_column(column)
    op.drop_table("quotas")
