"""``alembic upgrade head`` and back down on SQLite and on the PostgreSQL server here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from tagplan.db.migrate import ALEMBIC_INI, downgrade, upgrade
from tagplan.db.models import Base
from tests.backends import fresh_postgres_database

TABLES = set(Base.metadata.tables)


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_alembic_command_line_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'cli.db'}"  # in a directory not made yet
    env = {"TAGPLAN_DATABASE_URL": url, "PATH": str(Path(sys.executable).parent)}
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), "upgrade", "head"],
        check=True,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert _tables(url) >= TABLES


def test_up_and_down_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    assert _tables(url) >= TABLES | {"alembic_version"}
    downgrade(url)
    assert _tables(url) <= {"alembic_version"}


def test_up_and_down_on_postgresql() -> None:
    with fresh_postgres_database() as url:
        upgrade(url)
        assert _tables(url) >= TABLES | {"alembic_version"}
        downgrade(url)
        assert _tables(url) <= {"alembic_version"}
        upgrade(url)  # and up again after a full downgrade
        assert _tables(url) >= TABLES


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_models_match_the_migrations(dialect: str, tmp_path: Path) -> None:
    """Autogenerate finds nothing to add: the tables and the migrations agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    def check(url: str) -> None:
        upgrade(url)
        engine = create_engine(url)
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        engine.dispose()
        assert diff == []

    if dialect == "sqlite":
        check(f"sqlite:///{tmp_path / 'cmp.db'}")
    else:
        with fresh_postgres_database() as url:
            check(url)
