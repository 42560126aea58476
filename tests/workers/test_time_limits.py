"""A step over its Celery time limit fails its job with the reason; the prefork worker
(whose child received the soft limit) goes on with the next job."""

from __future__ import annotations

import pytest

from tests.workers.conftest import Stack


@pytest.mark.slow
def test_time_limit_fails_the_job_and_the_worker_goes_on(stack: Stack) -> None:
    for worker in list(stack.workers):
        stack.kill(worker)
    # Search and finish tasks may run their budget plus half a second: compiling BERT-Large's
    # distributed GraphDef for 16 GPUs alone takes several seconds, whatever the budget
    # leaves; the mlp's whole plan does not.
    stack.start_worker("limited", pool="prefork", TAGPLAN_TIME_LIMIT_MARGIN_S="0.5")
    slow = stack.client.submit("zoo:bert_large", cluster="testbed", options={"budget_s": 1})
    slow = stack.client.wait(slow["id"], timeout_s=300, wait_s=5)
    assert slow["status"] == "failed", slow
    assert "exceeded its time limit" in slow["error"]
    quick = stack.client.submit("zoo:mlp", cluster="testbed", options={"budget_s": 2, "seed": 4})
    assert stack.client.wait(quick["id"], timeout_s=300, wait_s=5)["status"] == "succeeded"
