"""Run the Alembic migrations from code (embedded start, tests) as ``alembic upgrade`` does."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["ALEMBIC_INI", "downgrade", "upgrade"]

ALEMBIC_INI = Path(__file__).resolve().parents[2] / "alembic.ini"
"""At the repository root, beside ``migrations/`` (images install the package editable)."""


def _config(url: str) -> Config:
    if not ALEMBIC_INI.exists():
        raise FileNotFoundError(f"{ALEMBIC_INI} is missing: run from a source checkout")
    config = Config(str(ALEMBIC_INI))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision``."""
    command.upgrade(_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Take the database at ``url`` back to ``revision``."""
    command.downgrade(_config(url), revision)
