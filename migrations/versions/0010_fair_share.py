"""Fair share: tenants' weights, each tenant's service per pipeline lane, the lanes'
clocks, retry backoff on the job, and the fair claim's indexes

Revision ID: 0010
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0012'
branch_labels = None
depends_on = None

FAIR = (('ix_jobs_fair_interactive', "status = 'queued' AND batch_id IS NULL"),
        ('ix_jobs_fair_bulk', "status = 'queued' AND batch_id IS NOT NULL"))


def upgrade() -> None:
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(sa.Column('share_weight', sa.Float(), nullable=False,
                                   server_default='1'))
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('ready_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table('tenant_service',
    sa.Column('pipeline', sa.String(length=200), nullable=False),
    sa.Column('lane', sa.String(length=16), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('pass', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('pipeline', 'lane', 'tenant_id')
    )
    op.create_table('lane_clocks',
    sa.Column('pipeline', sa.String(length=200), nullable=False),
    sa.Column('lane', sa.String(length=16), nullable=False),
    sa.Column('vtime', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('pipeline', 'lane')
    )
    for name, where in FAIR:
        op.create_index(name, 'jobs', ['pipeline', 'tenant_id', 'created_at'],
                        postgresql_where=sa.text(where), sqlite_where=sa.text(where))
    op.create_index('ix_jobs_queued_token', 'jobs', ['dispatch_token'],
                    postgresql_where=sa.text("status = 'queued'"),
                    sqlite_where=sa.text("status = 'queued'"))


def downgrade() -> None:
    op.drop_index('ix_jobs_queued_token', table_name='jobs')
    for name, _ in FAIR:
        op.drop_index(name, table_name='jobs')
    op.drop_table('lane_clocks')
    op.drop_table('tenant_service')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('ready_at')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('share_weight')
