"""Deployment files parse and agree with the code: compose services, images, Kubernetes
manifests, probes, resources, and every TAGPLAN_ variable is a real setting.

No container engine runs here, so the files are checked as data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tagplan.cli import app as cli
from tagplan.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SETTINGS = {f"TAGPLAN_{name.upper()}" for name in Settings.model_fields}


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def manifests() -> list[dict]:
    docs: list[dict] = []
    for name in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def test_compose_has_the_production_shape() -> None:
    services = compose()["services"]
    assert set(services) == {"api", "worker", "redis", "postgres", "flower", "migrate"}
    assert services["worker"]["deploy"]["replicas"] == 2
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
        assert services[name]["environment"]["TAGPLAN_BROKER_URL"].startswith("redis://redis")
        assert "@postgres:5432/" in services[name]["environment"]["TAGPLAN_DATABASE_URL"]
    assert services["migrate"]["command"] == ["alembic", "upgrade", "head"]
    assert services["migrate"]["restart"] == "no"
    for service in services.values():
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).exists()
        assert set(service.get("environment", {})) <= SETTINGS | {
            "POSTGRES_USER",
            "POSTGRES_PASSWORD",
            "POSTGRES_DB",
        }


def _pip_lines(dockerfile: str) -> str:
    text = (DEPLOY / dockerfile).read_text()
    return " ".join(line for line in text.splitlines() if "pip install" in line)


def test_api_image_has_neither_tensorflow_nor_torch_and_the_worker_has_both() -> None:
    api, worker = _pip_lines("Dockerfile.api"), _pip_lines("Dockerfile.worker")
    assert "pip install -e ." in api
    assert not re.search(r"tf|gnn|torch|tensorflow", api)
    assert "[tf,gnn]" in worker


@pytest.mark.parametrize("dockerfile", ["Dockerfile.api", "Dockerfile.worker"])
def test_images_run_existing_commands(dockerfile: str) -> None:
    text = (DEPLOY / dockerfile).read_text()
    assert "COPY migrations" in text and "alembic.ini" in text
    command = re.search(r'^CMD \["tagplan", "(\w+)"', text, re.MULTILINE)
    assert command is not None
    registered = {c.name for c in cli.registered_commands}
    assert command.group(1) in registered


def test_kubernetes_objects() -> None:
    kinds = sorted(d["kind"] for d in manifests())
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Job", "Service"]
    config = by_kind("ConfigMap")["tagplan-config"]
    assert set(config["data"]) <= SETTINGS


def test_every_container_has_resources_config_and_the_secret() -> None:
    config_names = set(by_kind("ConfigMap"))
    workloads = [*by_kind("Deployment").values(), *by_kind("Job").values()]
    assert len(workloads) == 3
    for workload in workloads:
        for container in containers(workload):
            assert container["resources"]["requests"]["cpu"]
            assert container["resources"]["requests"]["memory"]
            assert {e["configMapRef"]["name"] for e in container["envFrom"]} <= config_names
            secret = next(e for e in container["env"] if e["name"] == "TAGPLAN_DATABASE_URL")
            assert secret["valueFrom"]["secretKeyRef"]["name"] == "tagplan-secrets"


def test_api_probes_and_service() -> None:
    api = by_kind("Deployment")["tagplan-api"]
    (container,) = containers(api)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    assert str(ports["http"]) in container["args"]
    service = by_kind("Service")["tagplan-api"]
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert api["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ports


def test_worker_runs_the_worker_with_a_grace_period() -> None:
    worker = by_kind("Deployment")["tagplan-worker"]
    assert worker["spec"]["replicas"] >= 2
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60
    (container,) = containers(worker)
    assert container["args"][:2] == ["tagplan", "worker"]
    assert "livenessProbe" in container
