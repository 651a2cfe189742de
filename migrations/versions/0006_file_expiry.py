"""file expiry: files record when their bytes expired; batches keep their output policy

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index('ix_files_expires_at', ['expires_at'], unique=False)
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('output_expires_after_s', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_column('output_expires_after_s')
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.drop_index('ix_files_expires_at')
        batch_op.drop_column('expired_at')
