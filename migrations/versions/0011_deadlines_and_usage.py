"""Deadlines and usage: each job's start deadline and maximum run time, each attempt's
render time and device, and a usage record per finished job

Revision ID: 0011
Revises: 0007
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0007'
branch_labels = None
depends_on = None

QUEUED_WITH_DEADLINE = sa.text("status = 'queued' AND start_by IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('start_by', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('max_run_s', sa.Float(), nullable=True))
    op.create_index('ix_jobs_queued_start_by', 'jobs', ['start_by'],
                    postgresql_where=QUEUED_WITH_DEADLINE, sqlite_where=QUEUED_WITH_DEADLINE)
    with op.batch_alter_table('job_attempts') as batch:
        batch.add_column(sa.Column('render_s', sa.Float(), nullable=True))
        batch.add_column(sa.Column('device', sa.String(200), nullable=True))
    op.create_table(
        'job_usage',
        sa.Column('job_id', sa.String(40), primary_key=True),
        sa.Column('tenant_id', sa.String(40), sa.ForeignKey('tenants.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('model', sa.String(200), nullable=False),
        sa.Column('pipeline', sa.String(200), nullable=False),
        sa.Column('batch_id', sa.String(40), nullable=True),
        sa.Column('status', sa.String(16), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('render_s', sa.Float(), nullable=False),
        sa.Column('failed_render_s', sa.Float(), nullable=False),
        sa.Column('device', sa.String(200), nullable=True),
        sa.Column('characters', sa.Integer(), nullable=False),
        sa.Column('audio_s', sa.Float(), nullable=False),
        sa.Column('video_s', sa.Float(), nullable=False),
        sa.Column('frames', sa.Integer(), nullable=False),
        sa.Column('bytes', sa.BigInteger(), nullable=False),
    )
    op.create_index('ix_job_usage_tenant_finished', 'job_usage', ['tenant_id', 'finished_at'])


def downgrade() -> None:
    op.drop_index('ix_job_usage_tenant_finished', table_name='job_usage')
    op.drop_table('job_usage')
    with op.batch_alter_table('job_attempts') as batch:
        batch.drop_column('device')
        batch.drop_column('render_s')
    op.drop_index('ix_jobs_queued_start_by', table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('max_run_s')
        batch.drop_column('start_by')
