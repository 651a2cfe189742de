"""outputs: a variant per row, so a video's previews (thumbnail, spritesheet) are outputs

Revision ID: 0012
Revises: 0013
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('variant', sa.String(length=16), nullable=False,
                                      server_default='main'))
        batch_op.drop_constraint('uq_outputs_job_index', type_='unique')
        batch_op.create_unique_constraint('uq_outputs_job_index_variant',
                                          ['job_id', 'index', 'variant'])


def downgrade() -> None:
    op.execute("DELETE FROM outputs WHERE variant <> 'main'")
    with op.batch_alter_table('outputs', schema=None) as batch_op:
        batch_op.drop_constraint('uq_outputs_job_index_variant', type_='unique')
        batch_op.create_unique_constraint('uq_outputs_job_index', ['job_id', 'index'])
        batch_op.drop_column('variant')
