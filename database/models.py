"""ORM schema (SQLAlchemy 2.x declarative): the head revision of the migrations.

Migrations in `database/migrations/versions` build this schema step by step;
`tests/test_database.py` checks that the two agree, so edit both together.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class TargetRow(Base):
    """A machine (or device) that measurements were taken on; never mix records of two."""

    __tablename__ = "targets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    kind: Mapped[str] = mapped_column(String(50), nullable=False)
    description: Mapped[dict] = mapped_column(JSON, nullable=False)


class WorkloadRow(Base):
    """A fused subgraph at concrete shapes; `signature` groups the shapes of one dynamic family."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(100), unique=True, nullable=False)
    signature: Mapped[str] = mapped_column(String(100), index=True, nullable=False)
    family: Mapped[str] = mapped_column(String(100), nullable=False)
    template: Mapped[str] = mapped_column(String(100), nullable=False)
    template_version: Mapped[int] = mapped_column(Integer, nullable=False)
    json: Mapped[dict] = mapped_column(JSON, nullable=False)
    shapes: Mapped[list] = mapped_column(JSON, nullable=False)
    dims: Mapped[dict] = mapped_column(JSON, nullable=False)
    dtype: Mapped[str] = mapped_column(String(50), nullable=False)
    flops: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class RecordRow(Base):
    """One measurement, failures included (so the tuner never re-measures a config).

    `template`/`template_version` are kept per record as well as per workload:
    a workload re-tuned after a template revision keeps its old records exact.
    """

    __tablename__ = "records"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True, nullable=False)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"), nullable=False)
    template: Mapped[str] = mapped_column(String(100), nullable=False)
    template_version: Mapped[int] = mapped_column(Integer, nullable=False)
    config: Mapped[str] = mapped_column(Text, nullable=False)  # json.dumps(config, sort_keys=True)
    config_hash: Mapped[str] = mapped_column(String(32), nullable=False)
    latencies: Mapped[list] = mapped_column(JSON, nullable=False)
    median: Mapped[float | None] = mapped_column(Float, index=True)
    spread: Mapped[float | None] = mapped_column(Float)  # added by migration 0002
    status: Mapped[str] = mapped_column(String(32), index=True, nullable=False)
    error: Mapped[str] = mapped_column(Text, nullable=False, default="")
    compile_s: Mapped[float | None] = mapped_column(Float)
    strategy: Mapped[str] = mapped_column(String(100), nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)  # naive UTC
    version: Mapped[str] = mapped_column(String(50), nullable=False, default="")

    workload: Mapped[WorkloadRow] = relationship(lazy="joined")
    target: Mapped[TargetRow] = relationship(lazy="joined")

    __table_args__ = (
        Index("ix_records_lookup", "workload_id", "target_id", "status", "median"),
    )


class ClaimRow(Base):
    """A config that one tuner is measuring now (added by migration 0003).

    Concurrent tuners claim each config before measuring it, so none measures a config
    another one holds; the claim goes in the transaction that stores its record, and a
    crashed tuner's claims expire at `expires_at`. Keys, not ids: a workload's row only
    exists once its first record is stored.
    """

    __tablename__ = "claims"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_key: Mapped[str] = mapped_column(String(100), nullable=False)
    target_key: Mapped[str] = mapped_column(String(200), nullable=False)
    config_hash: Mapped[str] = mapped_column(String(32), nullable=False)
    owner: Mapped[str] = mapped_column(String(100), index=True, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)  # naive UTC

    __table_args__ = (
        UniqueConstraint("workload_key", "target_key", "config_hash", name="uq_claims_config"),
    )
