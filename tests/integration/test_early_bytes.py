"""A body sent while Redis counts the connection (ICL_REDIS_URL: the connection share is
shared) is held, not read without end: the server answers an oversized body 413, and the
client reads that answer. Before, uvloop went on reading after the protocol paused it in
`connection_made`, so a 2 MB body passed the 1 MiB held while Redis counted and the
connection was closed with the body unread (the client saw "connection reset by peer"; the
fresh-clone CI run's one failure, tests/integration/test_faults.py)."""

from __future__ import annotations

import threading

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.timeouts import MAX_EARLY_BYTES, server_config
from icl_heads.serving import embedded_backend
from model_worker.common.settings import Settings
from tests.integration.redis_support import free_port, private_db, wait_for
from tests.tiny_models import tiny_llama

pytestmark = [pytest.mark.redis]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_an_oversized_body_sent_at_once_is_answered_413(loop: str) -> None:
    with private_db() as redis_url:
        settings = Settings(
            model="tiny-llama",
            port=free_port(),
            redis_url=redis_url,
            rate_limit_per_minute=0,
            write_rate_limit_per_minute=0,
        )
        app = create_app(settings, embedded_backend(settings, loader=tiny_llama))
        server = uvicorn.Server(server_config(app, settings, loop=loop, log_level="error"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started, 30, "the server")
            body = b'{"prompt": "' + b"a" * (2 * MAX_EARLY_BYTES) + b'"}'
            answer = httpx.post(
                f"http://127.0.0.1:{settings.port}/api/analyses",
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=30,
            )
            assert answer.status_code == 413
            assert "larger than the limit" in answer.json()["detail"]
        finally:
            server.should_exit = True
            thread.join(timeout=10)
