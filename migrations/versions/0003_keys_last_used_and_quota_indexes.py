"""api_keys.last_used_at, and the indexes the submit path's quota counts use

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_jobs_tenant_status', 'jobs', ['tenant_id', 'status'])
    op.create_index('ix_jobs_pipeline_status', 'jobs', ['pipeline', 'status'])


def downgrade() -> None:
    op.drop_index('ix_jobs_pipeline_status', table_name='jobs')
    op.drop_index('ix_jobs_tenant_status', table_name='jobs')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('last_used_at')
