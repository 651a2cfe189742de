"""The console: operator keys, signed-in browser sessions, and each job's attempts

Revision ID: 0009
Revises: 0006
Create Date: 2026-12-10
"""

from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('operator', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    op.create_table(
        'console_sessions',
        sa.Column('id', sa.String(64), primary_key=True),
        sa.Column('key_id', sa.String(40), sa.ForeignKey('api_keys.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('csrf', sa.String(64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index('ix_console_sessions_last_seen', 'console_sessions', ['last_seen_at'])
    op.create_table(
        'job_attempts',
        sa.Column('job_id', sa.String(40), sa.ForeignKey('jobs.id', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('attempt', sa.Integer(), primary_key=True),
        sa.Column('worker_id', sa.String(200), nullable=True),
        sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('outcome', sa.String(16), nullable=True),
        sa.Column('error_code', sa.String(64), nullable=True),
        sa.Column('error_message', sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table('job_attempts')
    op.drop_index('ix_console_sessions_last_seen', table_name='console_sessions')
    op.drop_table('console_sessions')
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('operator')
