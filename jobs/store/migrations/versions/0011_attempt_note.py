"""An attempt's note: what a user should know about how it started ("resume_args not applied: no
checkpoint found under out/*.pt").

Revision ID: 0011_attempt_note
Revises: 0010_sweeps
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_attempt_note"
down_revision: str | None = "0010_sweeps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("note")
