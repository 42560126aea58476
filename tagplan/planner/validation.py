"""One wording for every input validated with pydantic (cluster specs, profiles,
communication profiles, strategies, the API's requests): ``invalid <subject>: <where>:
<what>; ...``, one entry per problem, the location in the input's own terms
(``machines[1] (m1).gpus.count``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

__all__ = ["MAX_SHOWN_CHARS", "describe_errors", "describe_validation_error", "dotted_location"]

MAX_SHOWN_CHARS = 80
"""The longest echo of a refused input value in a message."""


def dotted_location(loc: Sequence[Any]) -> str:
    """``ops[3].times_s[8]``: fields by dots, list items by index, dict keys marked."""
    text = ""
    for part in loc:
        if part == "[key]":
            text += " (key)"
        elif isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_SHOWN_CHARS` (an input may be a whole document)."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def describe_errors(
    errors: Sequence[Mapping[str, Any]],
    subject: str,
    *,
    location: Callable[[Sequence[Any]], str] = dotted_location,
    unknown_field: str = "unknown field",
    limit: int | None = None,
) -> str:
    """pydantic's error entries (``type``, ``loc``, ``msg``, ``input``) in one line, at
    most ``limit`` of them, then a count; FastAPI's request errors have the same shape."""
    problems = []
    for error in errors[:limit]:
        kind, message = error["type"], error["msg"]
        if kind == "value_error":
            message = message.removeprefix("Value error, ")
        elif kind == "extra_forbidden":
            message = unknown_field
        elif kind == "missing":
            message = "required field is missing"
        elif not isinstance(error.get("input"), Mapping | list):
            message = f"{message} (got {_shown(error.get('input'))})"
        where = location(error["loc"])
        problems.append(f"{where}: {message}" if where else message)
    if limit is not None and len(errors) > limit:
        problems.append(f"... and {len(errors) - limit} more")
    return f"invalid {subject}: " + "; ".join(problems) if problems else f"invalid {subject}"


def describe_validation_error(
    exc: ValidationError,
    subject: str,
    *,
    location: Callable[[Sequence[Any]], str] = dotted_location,
    unknown_field: str = "unknown field",
    limit: int | None = None,
) -> str:
    """The problems of ``exc`` in one line (:func:`describe_errors`)."""
    return describe_errors(
        exc.errors(include_url=False),
        subject,
        location=location,
        unknown_field=unknown_field,
        limit=limit,
    )
