"""Host states: a drain (reason and who), each GPU's device faults and quarantine, and the hosts' history.

Revision ID: 0013_host_states
Revises: 0012_attempt_error_message
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_host_states"
down_revision: str | None = "0012_attempt_error_message"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("drain_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("drained_by", sa.String(length=64), nullable=True))
    op.create_table(
        "host_gpus",
        sa.Column("host_id", sa.String(length=128), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("faults", sa.Integer(), nullable=False),
        sa.Column("quarantine_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("host_id", "gpu"),
    )
    op.create_table(
        "host_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("host_id", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_host_events_host_id_id", "host_events", ["host_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_host_events_host_id_id", table_name="host_events")
    op.drop_table("host_events")
    op.drop_table("host_gpus")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("drained_by")
        batch.drop_column("drain_reason")
