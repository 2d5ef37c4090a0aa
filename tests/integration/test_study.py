"""A study through a server: experiments × seeds submitted as one run (a few in flight), each
experiment's seeds combined, ending with the generated results document (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icl_heads.client import Client
from icl_heads.results_doc import TITLES
from icl_heads.study import DOCUMENT, STUDIES, paper_requests, remote_runner, run_study
from model_worker.common.settings import Settings
from tests.app_clients import embedded_client

pytestmark = pytest.mark.timeout(900)


def test_a_study_runs_every_experiment_under_every_seed_then_renders_the_document(
    tmp_path: Path,
) -> None:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0, warm_up=False)
    requests = paper_requests(["accuracy", "heads"], "sentiment-number", [0, 1], 8, None)
    assert len(requests) == 4 and {r.seed for r in requests} == {0, 1}
    with embedded_client(settings) as app:
        client = Client("http://testserver", progress=False)
        client._http = app  # the library's requests go to the app in this process
        document = run_study(requests, remote_runner(client, in_flight=2), tmp_path)
    text = document.read_text()
    assert document.name == DOCUMENT
    assert TITLES["accuracy"] in text and TITLES["heads"] in text
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["accuracy.json", "heads.json"]
    assert '"seeds": [\n  0,\n  1\n ]' in (tmp_path / "accuracy.json").read_text()
    assert set(STUDIES["paper"]) <= set(TITLES)
