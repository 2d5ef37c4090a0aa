"""Experiment sizes (issue 40.6d): the default finishes in about a minute on the CPU default,
and the size for ±5-point intervals is one click away on the form, labelled with its time."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from icl_heads.cli import app as cli
from model_worker.common.settings import Settings
from model_worker.contracts.experiments import DEFAULT_N, PRECISE_N, ExperimentRequest
from tests.app_clients import embedded_client


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with embedded_client(Settings(model="tiny-llama")) as test_client:
        yield test_client


def test_the_default_is_small_and_the_precise_size_gives_five_points() -> None:
    assert ExperimentRequest(name="accuracy", dataset="d").n == DEFAULT_N <= 50
    assert 1.96 * math.sqrt(0.25 / PRECISE_N) <= 0.05 < 1.96 * math.sqrt(0.25 / (PRECISE_N - 20))


def test_the_form_offers_both_sizes_and_fills_the_one_chosen(client: TestClient) -> None:
    page = BeautifulSoup(client.get("/experiments").text, "html.parser")
    assert page.select_one("input[name=n]")["value"] == str(DEFAULT_N)
    links = {a["data-n"]: a for a in page.select("[data-sizes] a[data-n]")}
    assert set(links) == {str(DEFAULT_N), str(PRECISE_N)}
    sizes = page.select_one("[data-sizes]").text
    assert "about a minute" in sizes and "±5-point" in sizes and "10× as long" in sizes
    chosen = BeautifulSoup(client.get(links[str(PRECISE_N)]["href"]).text, "html.parser")
    assert chosen.select_one("input[name=n]")["value"] == str(PRECISE_N)
    for bad in ("0", "1001", "²", "x"):
        assert client.get(f"/experiments?n={bad}").status_code == 422


def test_the_cli_defaults_to_the_same_size() -> None:
    shown = CliRunner().invoke(cli, ["experiment", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and f"[default: {DEFAULT_N}]" in shown.output
    assert f"{PRECISE_N} for ±5-point intervals" in shown.output
