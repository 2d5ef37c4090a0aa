"""`icl-heads worker` and `icl-heads serve`: the two long-running processes.

`serve` imports no torch when ICL_REDIS_URL is set (the web image has none); `worker` needs it.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

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

    from app.security.logs import install_log_hygiene
    from app.security.redact import redact
    from model_worker.cli import quietly, user_errors
    from model_worker.errors import UserInputError
    from model_worker.jobs import load_served_model
    from model_worker.service import ModelWorker, redis_for_worker

    settings = _settings(model=model, device=device, dtype=dtype, redis_url=redis_url)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    install_log_hygiene()
    with user_errors():
        if not settings.redis_url:
            raise UserInputError("a worker needs Redis: set ICL_REDIS_URL or pass --redis-url")
        connection = redis_for_worker(settings.redis_url)
        try:
            connection.ping()
        except RedisError as exc:
            message = redact(f"cannot reach Redis at {settings.redis_url}: {exc}")
            raise UserInputError(message) from exc
        loaded = quietly(lambda: load_served_model(settings))
    ModelWorker(loaded, settings, connection, device=settings.device).run(burst=burst)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How uvicorn serves: forwarded headers (X-Forwarded-For/-Proto) believed only from
    ICL_TRUSTED_PROXIES (uvicorn's own default believes them from 127.0.0.1, so any local user
    could pick a client address), no Server header."""
    proxies = settings.trusted_proxies
    return {
        "host": settings.host,
        "port": settings.port,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "server_header": False,
        "log_level": "info",
    }


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
    app = create_app(settings)
    uvicorn.Server(server_config(app, settings, **uvicorn_options(settings))).run()


def register(app: typer.Typer) -> None:
    """Add `worker` and `serve` to the `icl-heads` command."""
    app.command()(worker)
    app.command()(serve)
