"""Tenants: keys and jobs belong to one; who holds which content-addressed row

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 19:30:00.000000

Existing keys become tenants of their own (``key:<id>``), existing jobs their key's
tenant (``anonymous:loopback`` for jobs submitted without a key), and every tenant holds
the graphs and clusters of its jobs. Profiles and checkpoints have no recorded uploader:
they stay visible to operate and admin keys only, until a tenant uploads them again.

The downgrade drops the tenants; it fails when two tenants hold identical live jobs (the
one live job per key of revision 0002 cannot hold then): cancel one of each pair first.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = sa.text("status IN ('queued', 'running', 'succeeded')")
TENANT = sa.String(length=80)


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.add_column(sa.Column("tenant", TENANT, nullable=True))
    op.execute("UPDATE api_keys SET tenant = 'key:' || id")
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.alter_column("tenant", existing_type=TENANT, nullable=False)

    op.drop_index("uq_jobs_live_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("tenant", TENANT, nullable=True))
    op.execute(
        "UPDATE jobs SET tenant = CASE WHEN api_key_id IS NULL THEN 'anonymous:loopback' "
        "ELSE 'key:' || api_key_id END"
    )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.alter_column("tenant", existing_type=TENANT, nullable=False)
        batch_op.create_index(batch_op.f("ix_jobs_tenant"), ["tenant"], unique=False)
    op.create_index(
        "uq_jobs_live_tenant_key",
        "jobs",
        ["tenant", "key"],
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )

    op.create_table(
        "holdings",
        sa.Column("tenant", TENANT, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ref", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "kind", "ref"),
    )
    held = (("graph", "graph_id", "graphs", "g.label"), ("cluster", "cluster_id", "clusters", "''"))
    for kind, column, table, label in held:
        op.execute(
            "INSERT INTO holdings (tenant, kind, ref, label, created_at) "
            f"SELECT j.tenant, '{kind}', g.id, MIN({label}), MIN(j.created_at) "
            f"FROM jobs j JOIN {table} g ON g.id = j.{column} GROUP BY j.tenant, g.id"
        )


def downgrade() -> None:
    op.drop_table("holdings")
    op.drop_index("uq_jobs_live_tenant_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_tenant"))
        batch_op.drop_column("tenant")
    op.create_index(
        "uq_jobs_live_key",
        "jobs",
        ["key"],
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.drop_column("tenant")
