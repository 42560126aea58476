"""The Celery application, configured from :func:`tagplan.settings.get_settings` on first use.

Reliability settings follow the Celery guides (docs/design.md §9): late acknowledgement with
``reject_on_worker_lost`` so a task whose worker dies is redelivered (every step is
idempotent), prefetch 1 for long tasks, JSON only on the wire, and a Redis visibility
timeout above the longest job. With no broker configured (the embedded default) the
broker is kombu's in-memory transport and the worker runs inside the API process
(:mod:`tagplan.workers.embedded`).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from tagplan.settings import Settings, get_settings

__all__ = ["QUEUE", "app", "celery_config"]

QUEUE = "tagplan"


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery configuration for ``settings``."""
    broker = settings.broker_url or "memory://"
    backend = settings.result_backend
    if backend is None:
        backend = broker if broker.startswith(("redis://", "rediss://")) else "cache+memory://"
    return {
        "broker_url": broker,
        "result_backend": backend,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": settings.restore_interval_s,
            "unacked_restore_throttle": 1,
            "polling_interval": 0.1,
        },
        "broker_connection_retry_on_startup": True,
        # A submission fails within seconds when the broker is down (the API answers 503).
        "broker_connection_timeout": 2,
        "task_publish_retry_policy": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 1,
        },
        "task_default_queue": QUEUE,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": settings.worker_concurrency,
        "worker_hijack_root_logger": False,
        "result_expires": 7 * 24 * 3600,
    }


app = Celery("tagplan", include=["tagplan.workers.tasks"])
# A promise: the settings are read when the app is first used, not at import.
app.add_defaults(lambda: celery_config(get_settings()))
