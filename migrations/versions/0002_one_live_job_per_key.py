"""One live job per key: identical submissions arriving together get one job

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 19:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = sa.text("status IN ('queued', 'running', 'succeeded')")


def upgrade() -> None:
    op.create_index(
        "uq_jobs_live_key",
        "jobs",
        ["key"],
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )


def downgrade() -> None:
    op.drop_index("uq_jobs_live_key", table_name="jobs")
