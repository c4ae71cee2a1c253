"""An attempt's own error message: what ended it stays on its record once the job goes on (a retry that
succeeds clears the job's top-level error, not the attempt's).

Revision ID: 0012_attempt_error_message
Revises: 0011_attempt_note
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_attempt_error_message"
down_revision: str | None = "0011_attempt_note"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("error_message", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("error_message")
