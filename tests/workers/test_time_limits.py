"""A step over its Celery time limit says so, and the prefork worker (whose child received
the soft limit) goes on with the next job. The plan's own steps end by their budget; the
GraphDef a budget leaves out is compiled after the answer by a step with its own limit."""

from __future__ import annotations

import time

import pytest

from tagplan.service.client import TagplanError
from tests.workers.conftest import Stack


@pytest.mark.slow
def test_a_step_over_its_time_limit_says_so_and_the_worker_goes_on(stack: Stack) -> None:
    for worker in list(stack.workers):
        stack.kill(worker)
    # BERT-Large's distributed GraphDef for 16 GPUs takes seconds to compile: a 1 s budget
    # leaves it to the GraphDef step, here limited to half a second. The mlp's fits.
    stack.start_worker("limited", pool="prefork", TAGPLAN_GRAPHDEF_TIME_LIMIT_S="0.5")
    slow = stack.client.submit("zoo:bert_large", cluster="testbed", options={"budget_s": 1})
    assert stack.client.wait(slow["id"], timeout_s=300, wait_s=5)["status"] == "succeeded"
    result = stack.client.result(slow["id"])
    assert result["graphdef_deferred"] is True
    ends = time.monotonic() + 120
    while result["graphdef_error"] is None and time.monotonic() < ends:
        time.sleep(0.5)
        result = stack.client.result(slow["id"])
    assert result["graphdef_error"] == "step graphdef exceeded its time limit"
    with pytest.raises(TagplanError) as missing:
        stack.client.graphdef(slow["id"], timeout_s=10)
    assert missing.value.status == 404
    assert "exceeded its time limit" in missing.value.problem["detail"]
    quick = stack.client.submit("zoo:mlp", cluster="testbed", options={"budget_s": 2, "seed": 4})
    assert stack.client.wait(quick["id"], timeout_s=300, wait_s=5)["status"] == "succeeded"
    assert stack.client.graphdef(quick["id"], timeout_s=60)
