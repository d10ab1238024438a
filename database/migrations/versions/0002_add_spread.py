"""v2: records.spread (relative spread of the repeated timings), NULL for older records.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("spread", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("spread")
