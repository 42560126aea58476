"""The search prior in production-shaped processes (``tagplan serve`` and ``tagplan worker`` on
PostgreSQL and Redis): a job's shards in worker processes search with the checkpoint active
when it was submitted, and an API and a worker without torch plan with the uniform prior
and say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tagplan.gnn import prior_name, shipped_prior_name
from tagplan.gnn.checkpoint import save_checkpoint
from tagplan.gnn.model import PriorNet
from tests.workers.conftest import OwnRedis, Stack, running_stack

NO_TORCH = "import sys\nsys.modules['torch'] = None\nsys.modules['torch_geometric'] = None\n"
"""A ``sitecustomize`` that makes a process see no torch (importing it raises ImportError)."""


@pytest.mark.slow
def test_shards_search_with_the_checkpoint_the_job_recorded(stack: Stack, tmp_path: Path) -> None:
    path = tmp_path / "small.pt"
    name = prior_name(save_checkpoint(path, PriorNet(hidden=16, heads=2, layers=1), {}))
    http = stack.client.http
    uploaded = http.post("/v1/checkpoints", params={"name": "small"}, content=path.read_bytes())
    checkpoint_id = uploaded.json()["id"]
    try:
        assert http.put(f"/v1/checkpoints/{checkpoint_id}/active").status_code == 200
        options = {"budget_s": 2, "shards": 2, "seed": 21}
        job = stack.client.submit("zoo:mlp", cluster="testbed", options=options)
    finally:
        http.delete("/v1/checkpoints/active")  # while the job runs: it keeps its checkpoint
    job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
    assert job["status"] == "succeeded", job
    assert stack.client.result(job["id"])["prior"] == name


@pytest.mark.slow
def test_without_torch_the_service_plans_with_the_uniform_prior(
    tmp_path: Path, redis_server: OwnRedis
) -> None:
    """On a Redis of its own: the module's stack, alive meanwhile, consumes from the
    shared one."""
    no_torch = tmp_path / "no-torch"
    no_torch.mkdir()
    (no_torch / "sitecustomize.py").write_text(NO_TORCH)
    with running_stack(tmp_path, redis_server.url, PYTHONPATH=str(no_torch)) as stack:
        active = stack.client.http.get("/v1/checkpoints/active").json()
        assert active["prior"] == "shipped" and active["shipped"] == shipped_prior_name()
        job = stack.client.submit("zoo:mlp", cluster="testbed", options={"budget_s": 1})
        job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
        assert job["status"] == "succeeded", job
        result = stack.client.result(job["id"])
    assert result["prior"] == "uniform"
    assert result["prior_note"] == (
        "torch is not installed on the worker: uniform prior, not the shipped checkpoint"
    )
