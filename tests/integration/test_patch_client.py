"""`icl_heads.Client.patch`: single-prompt patching on a live server (embedded, tiny model):
the result comes back as the contract's PatchingResult, a refused pair as InvalidRequest with
the server's sentence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.main import create_app
from icl_heads.client import Client, InvalidRequest
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from model_worker.contracts.patching import PatchingResult
from tests.browser.live import serve
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = Settings(model="tiny-llama", write_rate_limit_per_minute=0)
    with serve(create_app(settings, embedded_backend(settings, loader=tiny_llama))) as base:
        yield base


def test_the_client_patches_and_reports_a_refused_pair(url: str) -> None:
    with Client(url, progress=False, poll_interval=0.1) as client:
        result = client.patch(
            EXAMPLE_PROMPT, "query", labels=["foo", "bar"], top_k=3, directions=["noising"]
        )
        assert isinstance(result, PatchingResult)
        assert result.corruption == "query" and [d.direction for d in result.directions] == [
            "noising"
        ]
        assert sum(h.exact is not None for h in result.direction("noising").heads) == 3
        with pytest.raises(InvalidRequest, match="same token length"):
            client.patch(EXAMPLE_PROMPT, "prompt", corrupted_prompt="love : foo one :")
