"""dispatch tokens, output retention, outbox job index

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('dispatch_token', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('outputs_deleted_at', sa.DateTime(timezone=True),
                                      nullable=True))
        batch_op.create_index('ix_jobs_expires', ['expires_at'], unique=False)
        batch_op.create_index('ix_jobs_completed', ['completed_at'], unique=False)
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.create_index('ix_outbox_job_id', ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_outbox_job_id')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_completed')
        batch_op.drop_index('ix_jobs_expires')
        batch_op.drop_column('outputs_deleted_at')
        batch_op.drop_column('expires_at')
        batch_op.drop_column('dispatch_token')
