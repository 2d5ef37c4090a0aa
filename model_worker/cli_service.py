"""`icl-heads worker` and `icl-heads serve`: the two long-running processes.

`serve` imports no torch when ICL_REDIS_URL is set (the web image has none); `worker` needs it.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from app.settings import Settings, get_settings


def _settings(**overrides: object) -> Settings:
    """The environment's settings with the command-line options that were given."""
    given = {key: value for key, value in overrides.items() if value is not None}
    return get_settings().model_copy(update=given)


def worker(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="HF id, local folder or .gguf (default ICL_MODEL)."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto (all GPUs via device_map), cpu, cuda:0 …")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="auto, float32, bfloat16, float16.")] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Redis URL (default ICL_REDIS_URL).")
    ] = None,
    burst: Annotated[bool, typer.Option(help="Exit when the queue is empty.")] = False,
) -> None:
    """Load a model once, then serve its analysis and experiment jobs from Redis."""
    from redis.exceptions import RedisError

    from model_worker.cli import quietly, user_errors
    from model_worker.errors import UserInputError
    from model_worker.jobs import load_served_model
    from model_worker.service import ModelWorker, redis_for_worker

    settings = _settings(model=model, device=device, dtype=dtype, redis_url=redis_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with user_errors():
        if not settings.redis_url:
            raise UserInputError("a worker needs Redis: set ICL_REDIS_URL or pass --redis-url")
        connection = redis_for_worker(settings.redis_url)
        try:
            connection.ping()
        except RedisError as exc:
            raise UserInputError(f"cannot reach Redis at {settings.redis_url}: {exc}") from exc
        loaded = quietly(lambda: load_served_model(settings))
    ModelWorker(loaded, settings, connection, device=settings.device).run(burst=burst)


def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (default ICL_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default ICL_PORT).")] = None,
    insecure: Annotated[
        bool, typer.Option(help="Allow a non-loopback address without ICL_AUTH_TOKEN.")
    ] = False,
) -> None:
    """Serve the dashboard and JSON API (embedded worker unless ICL_REDIS_URL is set)."""
    import uvicorn

    from app.main import create_app
    from app.security.bind import enforce_bind
    from app.timeouts import server_config

    settings = _settings(host=host, port=port)
    enforce_bind(settings.host, settings, insecure)
    uvicorn.Server(server_config(create_app(settings), settings, log_level="info")).run()


def register(app: typer.Typer) -> None:
    """Add `worker` and `serve` to the `icl-heads` command."""
    app.command()(worker)
    app.command()(serve)
