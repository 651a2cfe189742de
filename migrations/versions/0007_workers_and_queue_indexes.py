"""workers: the fleet's registry (heartbeats); partial indexes of queued jobs per lane

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0009'
branch_labels = None
depends_on = None

QUEUED = (('ix_jobs_queued_interactive', "status = 'queued' AND batch_id IS NULL"),
          ('ix_jobs_queued_bulk', "status = 'queued' AND batch_id IS NOT NULL"))


def upgrade() -> None:
    op.create_table('workers',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pipelines', sa.JSON(), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=True),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.String(length=40), nullable=True),
    sa.Column('draining_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    for name, where in QUEUED:
        op.create_index(name, 'jobs', ['pipeline', 'created_at'],
                        postgresql_where=sa.text(where), sqlite_where=sa.text(where))


def downgrade() -> None:
    for name, _ in QUEUED:
        op.drop_index(name, table_name='jobs')
    op.drop_table('workers')
