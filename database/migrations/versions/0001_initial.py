"""v1: targets, workloads, records (no `spread` yet).

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "targets",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(200), nullable=False, unique=True),
        sa.Column("kind", sa.String(50), nullable=False),
        sa.Column("description", sa.JSON, nullable=False),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(100), nullable=False, unique=True),
        sa.Column("signature", sa.String(100), nullable=False),
        sa.Column("family", sa.String(100), nullable=False),
        sa.Column("template", sa.String(100), nullable=False),
        sa.Column("template_version", sa.Integer, nullable=False),
        sa.Column("json", sa.JSON, nullable=False),
        sa.Column("shapes", sa.JSON, nullable=False),
        sa.Column("dims", sa.JSON, nullable=False),
        sa.Column("dtype", sa.String(50), nullable=False),
        sa.Column("flops", sa.Integer, nullable=False),
    )
    op.create_index("ix_workloads_signature", "workloads", ["signature"])
    op.create_table(
        "records",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("workload_id", sa.Integer, sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("target_id", sa.Integer, sa.ForeignKey("targets.id"), nullable=False),
        sa.Column("template", sa.String(100), nullable=False),
        sa.Column("template_version", sa.Integer, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("config_hash", sa.String(32), nullable=False),
        sa.Column("latencies", sa.JSON, nullable=False),
        sa.Column("median", sa.Float),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("compile_s", sa.Float),
        sa.Column("strategy", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("version", sa.String(50), nullable=False),
    )
    op.create_index("ix_records_workload_id", "records", ["workload_id"])
    op.create_index("ix_records_median", "records", ["median"])
    op.create_index("ix_records_status", "records", ["status"])
    op.create_index("ix_records_lookup", "records", ["workload_id", "target_id", "status", "median"])


def downgrade() -> None:
    op.drop_table("records")
    op.drop_table("workloads")
    op.drop_table("targets")
