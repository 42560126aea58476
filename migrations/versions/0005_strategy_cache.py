"""Answers from the strategy cache: cost keys and sources of results, analyzed graphs,
the search's progress history, anytime jobs and their refinements, traces per lane

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 14:00:00.000000

Results made before cost keys existed keep a null key: listed as stale, never used to
answer a job.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch_op:
        batch_op.add_column(sa.Column("lanes_digest", sa.String(length=64), nullable=True))
        batch_op.create_foreign_key(
            "fk_results_lanes_digest_blobs", "blobs", ["lanes_digest"], ["digest"]
        )
        batch_op.add_column(sa.Column("cost_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("planner_version", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("source", sa.String(length=16), nullable=False, server_default="search")
        )
        batch_op.add_column(sa.Column("cached_from", sa.String(length=36), nullable=True))
        batch_op.add_column(
            sa.Column("complete", sa.Boolean(), nullable=False, server_default=sa.true())
        )
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("history", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("refines", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("refined_by", sa.String(length=36), nullable=True))
    op.create_table(
        "analyses",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("blob_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["blob_digest"], ["blobs.digest"]),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("analyses")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("refined_by")
        batch_op.drop_column("refines")
        batch_op.drop_column("history")
    with op.batch_alter_table("results") as batch_op:
        batch_op.drop_column("complete")
        batch_op.drop_column("cached_from")
        batch_op.drop_column("source")
        batch_op.drop_column("planner_version")
        batch_op.drop_column("cost_key")
        batch_op.drop_constraint("fk_results_lanes_digest_blobs", type_="foreignkey")
        batch_op.drop_column("lanes_digest")
