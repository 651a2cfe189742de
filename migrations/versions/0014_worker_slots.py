"""The worker registry counts slots: a worker's engine slots, those held, and every job
in flight (a worker keeps several jobs on one engine)

Revision ID: 0014
Revises: 0010
Create Date: 2026-12-08
"""

from alembic import op
import sqlalchemy as sa

revision = '0014'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workers') as batch:
        batch.add_column(sa.Column('slots', sa.Integer(), nullable=False, server_default='1'))
        batch.add_column(sa.Column('slots_busy', sa.Integer(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('in_flight', sa.JSON(), nullable=False, server_default='[]'))


def downgrade() -> None:
    with op.batch_alter_table('workers') as batch:
        batch.drop_column('in_flight')
        batch.drop_column('slots_busy')
        batch.drop_column('slots')
