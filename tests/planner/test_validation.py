"""The one wording of validation errors: locations, messages, the echo of the input."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tagplan.planner.validation import (
    MAX_SHOWN_CHARS,
    describe_errors,
    describe_validation_error,
)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=3)
    count: int = Field(ge=0)


class Document(BaseModel):
    items: list[Item]


def error_of(data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Document.model_validate(data)
    return caught.value


def test_locations_messages_and_echo() -> None:
    exc = error_of({"items": [{"name": "ok", "count": -1, "color": "red"}, {"count": 1}]})
    assert describe_validation_error(exc, "document") == (
        "invalid document: items[0].count: Input should be greater than or equal to 0 (got -1)"
        "; items[0].color: unknown field; items[1].name: required field is missing"
    )


def test_a_long_input_is_cut() -> None:
    exc = error_of({"items": [{"name": "x" * 1000, "count": 1}]})
    message = describe_validation_error(exc, "document")
    assert "..." in message and len(message) < 100 + MAX_SHOWN_CHARS


def test_limit_counts_the_rest() -> None:
    exc = error_of({"items": [{"name": "x", "count": -1}] * 4})
    assert describe_validation_error(exc, "document", limit=1).endswith("; ... and 3 more")


def test_plain_error_entries_as_fastapi_gives_them() -> None:
    errors = [{"type": "missing", "loc": ("body", "graph"), "msg": "Field required"}]
    assert describe_errors(errors, "request") == (
        "invalid request: body.graph: required field is missing"
    )
    assert describe_errors([], "request") == "invalid request"
