"""Partial indexes for the maintenance sweeps: outputs still to expire, queued jobs by
their last change

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0013'
down_revision = '0011'
branch_labels = None
depends_on = None

# (name, column, predicate): each holds only the rows its sweep may return, so its cost
# follows what is due, not the table's history.
INDEXES = (
    ('ix_jobs_outputs_due', 'expires_at',
     "expires_at IS NOT NULL AND outputs_deleted_at IS NULL"),
    ('ix_jobs_queued_updated', 'updated_at', "status = 'queued'"),
)


def upgrade() -> None:
    for name, column, where in INDEXES:
        op.create_index(name, 'jobs', [column], postgresql_where=sa.text(where),
                        sqlite_where=sa.text(where))


def downgrade() -> None:
    for name, _, _ in INDEXES:
        op.drop_index(name, table_name='jobs')
