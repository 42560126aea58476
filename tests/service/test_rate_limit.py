"""The per-key rate limit: one window per key shared by every API process through the
Redis server here, in memory for the embedded service, open when Redis is gone."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tagplan.service.problems import Problem
from tagplan.service.rate_limit import (
    LocalRateLimiter,
    RedisRateLimiter,
    rate_limiter_for,
)
from tagplan.settings import Settings
from tests.backends import reset_redis


def _admitted(limiter, key: str, limit: int, requests: int) -> list[int | None]:
    """For each request, None when admitted, else its Retry-After seconds."""

    async def run() -> list[int | None]:
        found: list[int | None] = []
        for _ in range(requests):
            try:
                await limiter.check(key, limit)
                found.append(None)
            except Problem as problem:
                assert problem.status == 429
                found.append(int(problem.headers["Retry-After"]))
        return found

    return asyncio.run(run())


def test_two_api_processes_share_one_window_in_redis() -> None:
    url = reset_redis()
    key = uuid.uuid4().hex
    first, second = RedisRateLimiter(url), RedisRateLimiter(url)
    assert _admitted(first, key, 3, 2) == [None, None]
    refused = _admitted(second, key, 3, 2)
    assert refused[0] is None and refused[1] is not None and 1 <= refused[1] <= 60
    assert _admitted(first, key, 3, 1)[0] is not None  # the other process sees it too
    assert _admitted(first, uuid.uuid4().hex, 3, 1) == [None]  # another key: its own window


def test_concurrent_requests_cannot_all_take_the_last_place() -> None:
    url = reset_redis()
    key = uuid.uuid4().hex
    limiters = [RedisRateLimiter(url) for _ in range(4)]

    async def burst() -> int:
        async def one(limiter: RedisRateLimiter) -> bool:
            try:
                await limiter.check(key, 10)
                return True
            except Problem:
                return False

        results = await asyncio.gather(*(one(limiters[i % 4]) for i in range(40)))
        return sum(results)

    assert asyncio.run(burst()) == 10


def test_an_unreachable_redis_lets_requests_through_quickly() -> None:
    limiter = RedisRateLimiter("redis://127.0.0.1:1/0", timeout_s=0.2)
    start = time.monotonic()
    assert _admitted(limiter, "k", 1, 3) == [None, None, None]
    assert time.monotonic() - start < 5


def test_the_embedded_service_counts_in_memory() -> None:
    limiter = LocalRateLimiter()
    found = _admitted(limiter, "k", 2, 3)
    assert found[:2] == [None, None] and found[2] is not None and 1 <= found[2] <= 60


@pytest.mark.parametrize(
    ("environment", "kind"),
    [
        ({}, LocalRateLimiter),
        ({"broker_url": "redis://127.0.0.1:6379/0"}, RedisRateLimiter),
        ({"broker_url": "amqp://rabbit//"}, LocalRateLimiter),
        ({"broker_url": "amqp://rabbit//", "rate_limit_url": "redis://r/1"}, RedisRateLimiter),
    ],
)
def test_the_limiter_follows_the_configuration(environment: dict, kind: type) -> None:
    assert isinstance(rate_limiter_for(Settings(**environment)), kind)
