"""files and batches: OpenAI files, batches, refused batch lines; jobs know their batch

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

QUOTA_INDEXES = (('ix_jobs_tenant_status', 'tenant_id'), ('ix_jobs_pipeline_status', 'pipeline'))
INTERACTIVE = sa.text('batch_id IS NULL')


def upgrade() -> None:
    op.create_table('batches',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('endpoint', sa.String(length=32), nullable=False),
    sa.Column('input_file_id', sa.String(length=40), nullable=False),
    sa.Column('completion_window', sa.String(length=8), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=True),
    sa.Column('errors', sa.JSON(), nullable=True),
    sa.Column('output_file_id', sa.String(length=40), nullable=True),
    sa.Column('error_file_id', sa.String(length=40), nullable=True),
    sa.Column('total', sa.Integer(), nullable=False),
    sa.Column('completed', sa.Integer(), nullable=False),
    sa.Column('failed', sa.Integer(), nullable=False),
    sa.Column('rejected', sa.Integer(), nullable=False),
    sa.Column('lease_token', sa.String(length=32), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('in_progress_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finalizing_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancelling_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.create_index('ix_batches_status', ['status'], unique=False)
        batch_op.create_index('ix_batches_tenant_created', ['tenant_id', 'created_at', 'id'], unique=False)

    op.create_table('files',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.String(length=40), nullable=False),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('key', sa.String(length=500), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.create_index('ix_files_tenant_created', ['tenant_id', 'created_at', 'id'], unique=False)

    op.create_table('batch_rejections',
    sa.Column('batch_id', sa.String(length=40), nullable=False),
    sa.Column('line', sa.Integer(), nullable=False),
    sa.Column('custom_id', sa.String(length=512), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['batch_id'], ['batches.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('batch_id', 'line')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('batch_id', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('batch_index', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('custom_id', sa.String(length=512), nullable=True))
        batch_op.create_index('ix_jobs_batch_status', ['batch_id', 'status'], unique=False)
        batch_op.create_foreign_key('fk_jobs_batch_id', 'batches', ['batch_id'], ['id'], ondelete='CASCADE')
    # The interactive quotas count jobs of no batch only (batches have their own quota).
    for name, column in QUOTA_INDEXES:
        op.drop_index(name, table_name='jobs')
        op.create_index(name, 'jobs', [column, 'status'], postgresql_where=INTERACTIVE,
                        sqlite_where=INTERACTIVE)


def downgrade() -> None:
    for name, column in QUOTA_INDEXES:
        op.drop_index(name, table_name='jobs')
        op.create_index(name, 'jobs', [column, 'status'])
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_jobs_batch_id', type_='foreignkey')
        batch_op.drop_index('ix_jobs_batch_status')
        batch_op.drop_column('custom_id')
        batch_op.drop_column('batch_index')
        batch_op.drop_column('batch_id')

    op.drop_table('batch_rejections')
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.drop_index('ix_files_tenant_created')

    op.drop_table('files')
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_index('ix_batches_tenant_created')
        batch_op.drop_index('ix_batches_status')

    op.drop_table('batches')
