"""Sweeps: a hyperparameter search and its trials (each trial an ordinary job).

Revision ID: 0010_sweeps
Revises: 0009_priority_and_quotas
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_sweeps"
down_revision: str | None = "0009_priority_and_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
    )
    op.create_index("ix_sweeps_owner_id", "sweeps", ["owner", "id"])
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("allowed_rung", sa.Integer(), nullable=False),
        sa.Column("rung_values", sa.JSON(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"]),
        sa.PrimaryKeyConstraint("sweep_id", "number"),
    )
    op.create_index("ix_sweep_trials_job_id", "sweep_trials", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_sweep_trials_job_id", table_name="sweep_trials")
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    op.drop_index("ix_sweeps_owner_id", table_name="sweeps")
    op.drop_table("sweeps")
