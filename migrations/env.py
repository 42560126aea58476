"""Alembic environment: the URL comes from the caller or from tagplan's settings."""

from __future__ import annotations

from pathlib import Path

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import make_url

from tagplan.db.models import Base
from tagplan.settings import get_settings

config = context.config
url = config.attributes.get("url") or get_settings().sqlalchemy_url
target_metadata = Base.metadata


def run_offline() -> None:
    """Emit SQL without a database (``alembic upgrade head --sql``)."""
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)  # a fresh data dir
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
