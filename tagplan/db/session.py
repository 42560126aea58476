"""Engines and sessions: one engine per database URL, SQLite tuned for one writer thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["add_once", "engine_for", "insert_or_find", "session_scope"]

RowT = TypeVar("RowT")


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """The engine for ``url`` (cached: pools are per process, not per request)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Pre-ping: a connection broken by a database restart is replaced at checkout instead
    # of failing the first requests after the database is back (one local round trip).
    return create_engine(url, pool_pre_ping=True, pool_recycle=1800, pool_size=10, max_overflow=20)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL lets the API read while the in-process worker writes progress."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


@lru_cache(maxsize=8)
def _factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session committed on success and rolled back on error."""
    session = _factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def insert_or_find(
    session: Session, row: RowT, find: Callable[[], RowT | None]
) -> tuple[RowT, bool]:
    """Insert ``row`` unless ``find`` returns a stored row it stands for; the stored row
    and whether it existed. A concurrent request may insert the same row between the look
    and the insert: the database's unique constraint lets one win, and the loser returns
    the winner's row instead of an error."""
    stored = find()
    if stored is not None:
        return stored, True
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        stored = find()
        if stored is None:  # another constraint failed: not a race for this row
            raise
        return stored, True
    return row, False


def add_once(session: Session, row: RowT) -> RowT:
    """``row``, or the row stored under its primary key (content-addressed rows: graphs,
    clusters, blobs)."""
    kind = type(row)
    key = inspect(kind).primary_key_from_instance(row)
    return insert_or_find(session, row, lambda: session.get(kind, key))[0]
