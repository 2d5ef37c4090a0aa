"""One registry of experiment names (model_worker.contracts.EXPERIMENTS): the CLI's choices, the
API's accepted names, the experiments page's options and the job runner's table are the same set."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import get_args

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.main import create_app
from icl_heads.cli import app as cli
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.analysis import AnalysisRequest
from model_worker.contracts.common import NORM_MODES, RANKINGS, RankBy
from model_worker.contracts.experiments import EXPERIMENTS
from tests.tiny_models import tiny_gpt2

NAMES = set(EXPERIMENTS)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model="tiny-gpt2", write_rate_limit_per_minute=0)
    with TestClient(create_app(settings, embedded_backend(settings, loader=tiny_gpt2))) as c:
        yield c


def test_the_cli_offers_the_registry() -> None:
    refused = CliRunner().invoke(cli, ["experiment", "nope"])
    assert refused.exit_code == 2
    offered = refused.stderr.strip().split("is not one of ", 1)[1].rstrip(".").split(", ")
    assert [name.strip("'") for name in offered] == list(EXPERIMENTS)


def test_the_api_accepts_the_registry_and_nothing_else(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ExperimentRequest"]
    assert schema["properties"]["name"]["enum"] == list(EXPERIMENTS)
    refused = client.post("/api/experiments", json={"name": "nope", "dataset": "sentiment-number"})
    assert refused.status_code == 422


def test_the_page_offers_the_registry_with_its_descriptions(client: TestClient) -> None:
    page = client.get("/experiments").text
    assert re.findall(r'<input type="radio" name="name" value="([^"]+)"', page) == list(EXPERIMENTS)
    for experiment in EXPERIMENTS.values():
        assert experiment.description.replace("'", "&#39;") in page


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_name_has_a_runner(name: str) -> None:
    module = importlib.import_module(f"model_worker.experiments.{EXPERIMENTS[name].runner}")
    assert callable(module.run)


def test_the_home_page_offers_the_norm_modes(client: TestClient) -> None:
    page = client.get("/").text
    select = page.split('<select name="norm">', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]+)"', select) == list(NORM_MODES)
    assert 'value="fixed" selected' in select
    assert AnalysisRequest.model_json_schema()["properties"]["norm"]["enum"] == list(NORM_MODES)


def test_the_home_page_offers_the_rankings(client: TestClient) -> None:
    """The rank menu, the request's accepted values and RANKINGS are one set, in one order."""
    assert tuple(RANKINGS) == get_args(RankBy)
    page = client.get("/").text
    select = page.split('<select name="rank_by">', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]+)"', select) == list(RANKINGS)
    assert 'value="increase" selected' in select
    assert ">label increase</option>" in select
    assert AnalysisRequest.model_json_schema()["properties"]["rank_by"]["enum"] == list(RANKINGS)
