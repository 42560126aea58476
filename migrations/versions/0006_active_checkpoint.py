"""The checkpoint registry: which GNN checkpoint guides the searches of new jobs

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 10:00:00.000000

No row (the state after the upgrade): new jobs use the checkpoint the package ships.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "active_checkpoint",
        sa.Column("slot", sa.String(length=16), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("activated_by", sa.String(length=32), nullable=True),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["checkpoint_id"], ["checkpoints.id"]),
        sa.PrimaryKeyConstraint("slot"),
    )


def downgrade() -> None:
    op.drop_table("active_checkpoint")
