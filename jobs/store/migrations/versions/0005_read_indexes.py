"""Indexes for the read path: every query by (job_id, seq) and the newest transitions of a job are index ranges.

``job_metrics``' primary key (job_id, name, step) already serves queries by (job_id, name, step);
(job_id, step, name) serves a page of every name in step order.
The event feed reads metric points and checkpoints by (job_id, seq) and transitions by (job_id, id);
without these indexes each poll of a stream scanned the job's whole history. The quota check
counts an owner's jobs by status.

Revision ID: 0005_read_indexes
Revises: 0004_adjustments
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005_read_indexes"
down_revision: str | None = "0004_adjustments"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_job_metrics_job_seq", "job_metrics", ["job_id", "seq"], unique=False)
    # GET /metrics pages by (step, name) over every name: in that order along this index, never sorted whole.
    op.create_index("ix_job_metrics_job_step", "job_metrics", ["job_id", "step", "name"], unique=False)
    op.create_index("ix_job_checkpoints_job_seq", "job_checkpoints", ["job_id", "seq"], unique=False)
    # (job_id, id) serves everything the single-column index did, and orders by id within a job.
    op.create_index("ix_job_transitions_job_id_id", "job_transitions", ["job_id", "id"], unique=False)
    op.drop_index("ix_job_transitions_job_id", table_name="job_transitions")
    op.create_index("ix_jobs_owner_status", "jobs", ["owner", "status"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    op.create_index("ix_job_transitions_job_id", "job_transitions", ["job_id"], unique=False)
    op.drop_index("ix_job_transitions_job_id_id", table_name="job_transitions")
    op.drop_index("ix_job_checkpoints_job_seq", table_name="job_checkpoints")
    op.drop_index("ix_job_metrics_job_step", table_name="job_metrics")
    op.drop_index("ix_job_metrics_job_seq", table_name="job_metrics")
