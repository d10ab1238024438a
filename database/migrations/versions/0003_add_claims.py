"""v3: claims, the configs that a running tuner is measuring (so concurrent tuners never
measure one twice); rows are short-lived, so the upgrade copies nothing.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("workload_key", sa.String(100), nullable=False),
        sa.Column("target_key", sa.String(200), nullable=False),
        sa.Column("config_hash", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("workload_key", "target_key", "config_hash", name="uq_claims_config"),
    )
    op.create_index("ix_claims_owner", "claims", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_claims_owner", "claims")
    op.drop_table("claims")
