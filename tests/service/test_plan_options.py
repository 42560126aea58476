"""The API's plan options come from the planner's: same names, types and defaults, every
number bounded for the database, and a planner option the API does not place is refused."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pytest

from tagplan.planner.options import PlanOptions, option_names
from tagplan.service.schemas import (
    INT32_MAX,
    SERVER_SIDE_OPTIONS,
    PlanOptionsIn,
    plan_option_fields,
)

REQUEST_ONLY = {"profiles", "fresh", "deadline_s", "refine_s"}


def test_the_request_names_every_planner_option_but_the_server_side_ones() -> None:
    assert set(PlanOptionsIn.model_fields) - REQUEST_ONLY == option_names() - SERVER_SIDE_OPTIONS


def test_the_defaults_are_the_planners() -> None:
    requested = PlanOptionsIn().model_dump(exclude=REQUEST_ONLY)
    planner = asdict(PlanOptions())
    assert requested == {name: planner[name] for name in requested}


def test_a_request_builds_the_planners_options() -> None:
    requested = PlanOptionsIn(budget_s=5, iterations=7, seed=3, sfb=False, shards=2)
    options = PlanOptions(**requested.model_dump(exclude=REQUEST_ONLY))
    assert (options.budget_s, options.iterations, options.shards) == (5.0, 7, 2)


def test_every_number_is_bounded_for_the_database() -> None:
    schema = PlanOptionsIn.model_json_schema()["properties"]
    for name in option_names() - SERVER_SIDE_OPTIONS:
        variants = schema[name].get("anyOf", [schema[name]])
        for variant in variants:
            if variant["type"] == "integer":
                assert variant["maximum"] <= INT32_MAX, name
            if variant["type"] == "number":
                assert "maximum" in variant, name


def test_a_planner_option_the_api_does_not_place_is_refused() -> None:
    @dataclass(frozen=True)
    class GrownOptions(PlanOptions):
        temperature: float = 1.0

    with pytest.raises(TypeError, match="temperature"):
        plan_option_fields(GrownOptions)
