"""Service and worker configuration from ``TAGPLAN_*`` environment variables (docs/design.md §9).

One :class:`Settings` shared by the API, the workers and the migrations, built on demand by
:func:`get_settings` (cached; tests clear the cache after changing the environment), never at
import time. With no ``TAGPLAN_BROKER_URL`` the service runs embedded: SQLite under
``data_dir`` and the Celery tasks in-process.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]

KIB = 1 << 10
MIB = 1 << 20


class Settings(BaseSettings):
    """Everything the service and the workers read from the environment."""

    model_config = SettingsConfigDict(env_prefix="TAGPLAN_", extra="ignore")

    data_dir: Path = Path("tagplan-data")
    database_url: str | None = None
    """SQLAlchemy URL; default: a SQLite file in ``data_dir``."""
    broker_url: str | None = None
    """Celery broker (Redis in production); unset: embedded, tasks run in-process."""
    result_backend: str | None = None
    """Celery result backend for shard chords; default: the broker (Redis) or in-memory."""
    visibility_timeout_s: int = Field(default=7200, gt=0)
    """Redis redelivers an unacknowledged task after this long: above the longest job."""
    restore_interval_s: int = Field(default=10, ge=1)
    """How often a worker looks for tasks of dead workers whose visibility timeout passed."""
    worker_concurrency: int = Field(default=1, ge=1)

    max_request_bytes: int = Field(default=64 * MIB, gt=0)
    max_header_bytes: int = Field(default=16 * KIB, gt=0)
    """Request line and headers: uvicorn's h11 parser buffers no more of an unfinished head
    (``tagplan serve``), and the service refuses a longer one with 431."""
    max_graph_bytes: int = Field(default=512 * MIB, gt=0)
    """Decompressed graph size."""
    max_ops: int = Field(default=200_000, gt=0)
    max_gpus: int = Field(default=1024, gt=0)
    max_budget_s: float = Field(default=3600.0, gt=0)
    max_shards: int = Field(default=64, ge=1)
    rate_limit_per_minute: int = Field(default=600, gt=0)
    """Requests per API key and minute unless the key sets its own."""
    rate_limit_url: str | None = None
    """Redis holding the request windows every API process shares; default: the broker
    when it is Redis, else each process counts its own (the embedded service)."""
    strategy_cache_ttl_s: float = Field(default=2.0, ge=0)
    """``GET /v1/strategies`` answers repeat queries from memory this long (0: never)."""
    allow_anonymous_loopback: bool = False
    """Let requests from 127.0.0.1/::1 through without a key (the embedded demo)."""

    task_max_attempts: int = Field(default=3, ge=1)
    """A step whose worker died this many times fails its job instead of looping."""
    time_limit_margin_s: float = Field(default=300.0, gt=0)
    """Added to a job's search budget for the Celery soft time limit."""
    graphdef_time_limit_s: float = Field(default=600.0, gt=0)
    """The Celery soft time limit of the step that compiles a job's GraphDef after its
    answer, when the budget left the compile out (not bounded by the budget)."""
    sweep_interval_s: float = Field(default=15.0, gt=0)
    """How often the API process looks for lost jobs (:mod:`tagplan.workers.sweeper`)."""
    stall_grace_s: float = Field(default=90.0, ge=0)
    """A job is lost when nothing of it reported for its soft time limit plus this long
    (above the minute by which a step that ignores the soft limit may overrun it)."""
    max_dispatches: int = Field(default=4, ge=1)
    """A job sent to the broker this many times (the first and every re-dispatch of a lost
    job) fails with the reason when it is lost again."""

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, value: str | None) -> str | None:
        """``postgresql://`` (what operators write) means psycopg 3, the installed driver."""
        if value and value.startswith(("postgresql://", "postgres://")):
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: the worker runs inside the API process."""
        return not self.broker_url

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL, defaulting to ``data_dir/tagplan.db``."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'tagplan.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    """The process's settings (cached; ``get_settings.cache_clear()`` re-reads them)."""
    return Settings()
