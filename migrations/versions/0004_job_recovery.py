"""Job recovery: how often a job was dispatched, and the sweeper's lease

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 11:00:00.000000

Existing jobs count one dispatch (the one that created them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(
            sa.Column("dispatches", sa.Integer(), nullable=False, server_default="1")
        )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("leases")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("dispatches")
