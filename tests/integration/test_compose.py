"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The compose file is validated against the Compose specification's JSON schema (vendored in
tests/data/compose_spec.json from the docker-compose 1.29.2 wheel), and the commands it runs are
the `icl-heads` commands the other tests run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose_spec.json").read_text())


def test_compose_file_follows_the_compose_specification() -> None:
    validator = jsonschema.Draft201909Validator(SCHEMA)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert errors == []


def test_schema_check_catches_a_mistake() -> None:
    broken: dict[str, Any] = json.loads(json.dumps(COMPOSE))
    broken["services"]["web"]["healthcheck"]["retries"] = "three"
    assert list(jsonschema.Draft201909Validator(SCHEMA).iter_errors(broken))


def test_compose_has_redis_web_and_a_gpu_worker_with_health_checks() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"redis", "cache", "web", "worker"}
    assert all("healthcheck" in service for service in services.values())
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "model-cache:/models" in services["worker"]["volumes"]
    assert "model-cache" in COMPOSE["volumes"]
    for name in ("web", "worker"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["cache"]["condition"] == "service_healthy"
        url = services[name]["environment"]["ICL_REDIS_URL"]
        assert url == "redis://:${ICL_REDIS_PASSWORD:?set ICL_REDIS_PASSWORD}@redis:6379/0"
        cache = services[name]["environment"]["ICL_CACHE_REDIS_URL"]
        assert cache == "redis://:${ICL_REDIS_PASSWORD:?set ICL_REDIS_PASSWORD}@cache:6379/0"
        assert services[name]["environment"]["ICL_RESULT_KEYS"].startswith("${ICL_RESULT_KEYS:?")


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_a_full_redis_cannot_wedge_the_service() -> None:
    """Issue 24.6: the queue never evicts (no job is lost), and it holds no results; the
    results' Redis is bounded and evicts the least recently used key when full instead of
    refusing writes (an evicted result is computed again)."""
    queue = COMPOSE["services"]["redis"]["command"]
    cache = COMPOSE["services"]["cache"]["command"]
    assert option(queue, "--maxmemory-policy") == "noeviction"
    assert option(cache, "--maxmemory-policy") == "allkeys-lru"
    assert option(cache, "--maxmemory").startswith("${ICL_CACHE_MAXMEMORY:-")
    assert option(cache, "--appendonly") == "no" and option(cache, "--save") == ""
    assert "ports" not in COMPOSE["services"]["cache"]
    assert "requirepass $$ICL_REDIS_PASSWORD" in cache[2]


def test_redis_needs_a_password_and_publishes_no_port() -> None:
    redis = COMPOSE["services"]["redis"]
    assert "ports" not in redis and "network_mode" not in redis
    assert redis["environment"]["ICL_REDIS_PASSWORD"].startswith("${ICL_REDIS_PASSWORD:?")
    assert "requirepass $$ICL_REDIS_PASSWORD" in redis["command"][2]
    assert "ICL_REDIS_PASSWORD" not in " ".join(redis["command"][3:])  # not on the command line
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][1]
    assert COMPOSE["services"]["web"]["environment"]["ICL_AUTH_TOKEN"].startswith(
        "${ICL_AUTH_TOKEN:?"
    )


def compose_redis_command(port: int, folder: Path) -> list[str]:
    """The compose file's redis command as a shell runs it (`$$` is compose's `$`), on `port`."""
    command = [part.replace("$$", "$") for part in COMPOSE["services"]["redis"]["command"]]
    return [*command, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]


@pytest.mark.redis
def test_compose_redis_command_refuses_clients_without_the_password(tmp_path: Path) -> None:
    from redis import Redis
    from redis.exceptions import AuthenticationError, ResponseError

    from tests.integration.redis_support import free_port, pings, stop, wait_for

    port, password = free_port(), "c0ffee" * 6
    env = {"PATH": "/usr/bin:/bin", "ICL_REDIS_PASSWORD": password}
    server = subprocess.Popen(
        compose_redis_command(port, tmp_path), env=env, stdout=subprocess.DEVNULL
    )
    try:
        authenticated = Redis(port=port, password=password)
        wait_for(lambda: pings(authenticated), 20, "the compose redis command to start")
        with pytest.raises((AuthenticationError, ResponseError), match="(?i)auth"):
            Redis(port=port).set("icl:queue:x", "1")
        with pytest.raises((AuthenticationError, ResponseError)):
            Redis(port=port, password="wrong").ping()
        shown = subprocess.run(
            ["ps", "-o", "args=", "-p", str(server.pid)], capture_output=True, text=True
        )
        assert password not in shown.stdout
    finally:
        stop(server)


@pytest.mark.parametrize("service", ["web", "worker"])
def test_compose_commands_are_real_cli_commands(service: str) -> None:
    program, command, *args = COMPOSE["services"][service]["command"]
    assert program == "icl-heads"
    assert command == {"web": "serve", "worker": "worker"}[service]
    icl_heads = shutil.which("icl-heads", path=str(Path(sys.executable).parent))
    assert icl_heads is not None
    shown = subprocess.run(
        [icl_heads, command, "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in (arg for arg in args if arg.startswith("--")):
        assert re.search(rf"{option}\b", shown), f"{option} is not an option of {command}"


def test_web_requirements_cover_every_dependency_but_the_model_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    model_stack = {"torch", "transformers", "gguf", "accelerate", "safetensors"}
    needed = {re.split(r"[<>=!~\[ ]", dep)[0].lower() for dep in project["dependencies"]}
    listed = {
        re.split(r"[<>=!~\[ ]", line)[0].lower()
        for line in (ROOT / "docker" / "requirements-web.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert needed - model_stack == listed


WEB_WITHOUT_TORCH = """
import sys
for name in ("torch", "transformers", "accelerate", "safetensors", "gguf"):
    sys.modules[name] = None  # importing any of them now fails
from fastapi.testclient import TestClient
from app.main import create_app
from model_worker.common.settings import Settings
from icl_heads.cli import app as cli
settings = Settings(redis_url=sys.argv[1], write_rate_limit_per_minute=0)
with TestClient(create_app(settings)) as client:
    print(client.get("/healthz").status_code, client.get("/api/models").json())
"""


@pytest.mark.redis
def test_web_tier_runs_without_torch() -> None:
    from tests.integration.redis_support import private_db

    with private_db() as url:
        done = subprocess.run(
            [sys.executable, "-c", WEB_WITHOUT_TORCH, url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["200", "[]"]


def test_dockerfile_web_stage_installs_no_torch() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    web_stage = dockerfile.split("AS web", 1)[1].split("\nFROM ", 1)[0]
    assert "requirements-web.txt" in web_stage
    assert "--no-deps" in web_stage
    assert "torch" not in (ROOT / "docker" / "requirements-web.txt").read_text().replace(
        "no torch", ""
    )
