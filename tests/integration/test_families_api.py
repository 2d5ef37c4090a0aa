"""The family catalog through `icl-heads models` and GET /api/families, and bad model input:
an unsupported model_type, a config that declares a family, weights that do not match."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.main import create_app
from icl_heads.cli import app
from icl_heads.serving import embedded_backend
from model_worker.common.errors import UnsupportedModelError
from model_worker.common.settings import Settings
from model_worker.model.adapters import DECLARED_FAMILY_KEY, REGISTRY, spec_for
from tests.integration.test_cli_analyze import _error
from tests.tiny_models import tiny_family, tiny_llama

runner = CliRunner()


@pytest.fixture()
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0)
    with TestClient(create_app(settings, embedded_backend(settings, loader=tiny_llama))) as test:
        yield test


def test_api_lists_every_registered_family(client: TestClient) -> None:
    body = client.get("/api/families").json()
    assert [entry["family"] for entry in body] == list(REGISTRY)
    gemma2 = next(entry for entry in body if entry["family"] == "gemma2")
    assert "final soft-cap" in gemma2["features"] and "post-norms" in gemma2["block"]
    llama = client.get("/api/families", params={"model_type": "llama"}).json()
    assert llama[0]["verified"]["real_checkpoints"] == ["SmolLM2-135M-Instruct"]


def test_api_unsupported_family_is_422_naming_the_supported(client: TestClient) -> None:
    answer = client.get("/api/families", params={"model_type": "bert"})
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert "unsupported model_type 'bert'" in detail and "gpt_neox" in detail


def test_cli_models_lists_families_and_checks() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    for family in REGISTRY:
        assert any(line.startswith(family + " ") for line in result.stdout.splitlines())
    assert "zeroed head = its slice removed" in result.stdout
    data = json.loads(runner.invoke(app, ["models", "--json"]).stdout)
    assert {entry["family"] for entry in data} == set(REGISTRY)


def test_the_catalog_imports_no_torch() -> None:
    code = "import sys, app.routes.families; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("model_type", ["bert", "not_a_model_type"])
def test_cli_unsupported_family_is_one_line(tmp_path: Path, model_type: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    line = _error(["analyze", "-m", str(tmp_path), "-p", "a : b"])
    assert f"unsupported model_type {model_type!r}; supported: " in line
    assert all(family in line for family in REGISTRY)


def test_a_config_may_declare_a_registered_family_never_guessed() -> None:
    class Config:
        model_type = "my_llama_clone"

    with pytest.raises(UnsupportedModelError, match="'my_llama_clone'"):
        spec_for("my_llama_clone", Config())
    setattr(Config, DECLARED_FAMILY_KEY, "llama")
    assert spec_for("my_llama_clone", Config()) is REGISTRY["llama"]
    setattr(Config, DECLARED_FAMILY_KEY, "nope")
    with pytest.raises(UnsupportedModelError, match="declares icl_heads_family='nope'"):
        spec_for("my_llama_clone", Config())


@pytest.mark.parametrize("change", [{"intermediate_size": 40}, {"num_key_value_heads": 4}])
def test_weights_that_do_not_match_the_config_are_one_line(tmp_path: Path, change: dict) -> None:
    loaded = tiny_family("qwen3")
    loaded.model.save_pretrained(tmp_path)
    loaded.tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    line = _error(["analyze", "-m", str(tmp_path), "-p", "a : b", "--device", "cpu"])
    assert "weights do not match its config" in line
