"""Uploads: a graph as a binary body or a multipart file, then planned by id; checkpoints."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tagplan.planner.zoo import catalog
from tests.service.conftest import assert_problem, make_key, wait_for


def test_graph_binary_body_and_multipart_give_one_graph(service: TestClient) -> None:
    submitter = make_key("submit")
    data = catalog.read_graph_bytes("mlp")
    binary = service.post("/v1/graphs?label=mlp", content=data, headers=submitter)
    assert binary.status_code == 201, binary.text
    form = service.post("/v1/graphs", files={"file": ("mlp.pb.gz", data)}, headers=submitter)
    assert form.status_code == 201
    assert form.json()["id"] == binary.json()["id"]
    graph = service.get(f"/v1/graphs/{binary.json()['id']}", headers=submitter).json()
    assert graph["num_nodes"] > 0
    assert graph["label"] in ("mlp", "zoo:mlp")  # the first upload of these bytes names them

    model = catalog.get_model("mlp")
    body = {
        "graph": {
            "id": graph["id"],
            "batch_inputs": [e["name"] for e in model.inputs],
            "loss": model.loss_node,
        },
        "cluster": "testbed",
        "options": {"budget_s": 1, "seed": 3},
    }
    job = service.post("/v1/jobs", json=body, headers=submitter).json()
    assert wait_for(service, submitter, job["id"])["status"] == "succeeded"


def test_empty_and_formless_uploads(service: TestClient) -> None:
    submitter = make_key("submit")
    assert_problem(service.post("/v1/graphs", content=b"", headers=submitter), 422, "empty")
    no_file = service.post("/v1/graphs", files={"other": ("x", b"1")}, headers=submitter)
    assert_problem(no_file, 422, "'file'")


def test_checkpoints(service: TestClient) -> None:
    operator = make_key("operate")
    created = service.post(
        "/v1/checkpoints?name=prior-v1",
        files={"file": ("prior.pt", b"\x80weights")},
        headers=operator,
    )
    assert created.status_code == 201, created.text
    checkpoint = created.json()
    assert checkpoint["meta"] == {"size_bytes": 8, "filename": "prior.pt"}
    listed = service.get("/v1/checkpoints", headers=operator).json()
    assert checkpoint["id"] in {c["id"] for c in listed}
    data = service.get(f"/v1/checkpoints/{checkpoint['id']}", headers=operator).content
    assert data == b"\x80weights"
    assert_problem(
        service.post("/v1/checkpoints?name=x", content=b"1", headers=make_key("submit")), 403
    )
